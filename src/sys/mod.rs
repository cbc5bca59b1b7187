//! The bottom layer: what talks to the operating system for every other
//! layer, knowing nothing of them but `model`'s plain values (no capnp, no
//! engine). Engines, the connection plumbing and the client stand on it.

mod descriptors;
mod filesystem;
mod host;
pub mod low_slots;
mod refused_descriptors;
mod scm;
mod socket;

pub use self::descriptors::{
    ASLEEP_AFTER, Closes, MAX_CLOSING_THREADS, MAX_OWNERS_IN_LINE, close_in_background,
    close_what_was_kept, closes_backed_up, closing_for, closing_threads,
    keep_closes_for_the_next_binary, kept_for_the_next_binary, no_close_in_progress,
    waiting_to_close,
};
pub use self::filesystem::filesystem_magic;
pub use self::host::{HostConfig, KernelFeature};
pub use self::refused_descriptors::{
    descriptors_waiting, kernel_refuses_descriptors, refuse_descriptors, refuse_descriptors_or_warn,
};
pub(crate) use self::scm::send_with_byte;
pub use self::scm::{SCM_MAX_FD, bytes_without_descriptors, receive as receive_with_descriptors};
pub use self::socket::Socket;
