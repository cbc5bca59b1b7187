//! TLS records sealed and opened by capexec once rustls has made the
//! handshake.
//!
//! Why: rustls's buffered API copies every byte it receives three times
//! in user space (into its deframer, into a vector per record, out to the
//! reader); opened here, a record is decrypted straight from the socket's
//! buffer into the reader's in one pass, which takes 40 % less of the
//! receiving end's CPU (docs/PROFILES.md, "Records opened by hand").
//! A record whose content lies in one of the writer's slices is sealed
//! the same way, in one pass from the caller's bytes into the outgoing
//! buffer; others are copied into their record and sealed in place, as
//! rustls seals every record.
//!
//! rustls still makes the handshake (`handshake`, through its unbuffered
//! API) and keeps what follows it that is not records: its kernel
//! connection (`rustls::kernel`, the API made for kernel TLS) derives the
//! next traffic keys when either side sends a KeyUpdate, and takes the
//! session tickets a server sends after the handshake. What this layer
//! does itself: the records of TLS 1.3 and TLS 1.2 (`protection`), alerts
//! and close_notify, post-handshake messages split across records
//! (`reader`), and a KeyUpdate of its own before its key has sealed as
//! many records as the suite allows (`writer`).

mod handshake;
mod keys;
mod opening;
mod protection;
mod reader;
mod writer;

pub(crate) use self::handshake::{Established, client, server};

#[cfg(test)]
mod tests;
