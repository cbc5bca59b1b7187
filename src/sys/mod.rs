//! The bottom layer: what talks to the operating system for every other
//! layer, knowing nothing of them but `model`'s plain values (no capnp, no
//! engine). Engines, the connection plumbing and the client stand on it.

mod descriptors;
mod host;
mod socket;

pub use self::descriptors::{
    Closes, MAX_CLOSING_THREADS, close_in_background, closing_for, keep_closes_for_the_next_binary,
    kept_for_the_next_binary, waiting_to_close,
};
pub use self::host::{HostConfig, KernelFeature};
pub use self::socket::Socket;
