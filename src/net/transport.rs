//! Cap'n Proto two-party networks over tokio streams, tuned and guarded the
//! same way on both ends.

use std::cell::Cell;
use std::rc::Rc;

use capnp_rpc::rpc_twoparty_capnp::Side;
use capnp_rpc::twoparty::VatNetwork;

use crate::net::frame::FrameReader;
use crate::net::guard::{CallLimits, GuardedNetwork};
use crate::net::session::Session;
use crate::net::writer::FrameWriter;

/// Flow-control window of each `-> stream` capability (event sinks): bytes
/// in flight before the sender waits for acknowledgements; the same window
/// a subscription keeps itself.
pub(crate) const STREAM_WINDOW_BYTES: usize = crate::rpc::SUBSCRIPTION_WINDOW_BYTES;

/// A connection's network, ready for an `RpcSystem`.
pub(crate) type Network = Box<dyn capnp_rpc::VatNetwork<Side>>;

/// The two-party network over `reader` and `writer`, guarded by `limits`
/// once `session` has logged in (and by the login limits before).
pub(crate) fn network<R, W>(
    reader: R,
    writer: W,
    side: Side,
    limits: CallLimits,
    session: Rc<Session>,
) -> Network
where
    R: tokio::io::AsyncRead + Unpin + 'static,
    W: tokio::io::AsyncWrite + Unpin + 'static,
{
    // Each side allocates a message per call: keep their buffers.
    crate::rpc::tune_allocator();
    let written = Rc::new(Cell::new(0));
    // The guard reads the socket itself; capnp-rpc's network only writes.
    let mut network = VatNetwork::new(
        futures::io::empty(),
        FrameWriter::new(writer, Rc::clone(&written)),
        side,
        capnp::message::ReaderOptions::new(),
    );
    network.set_window_size(STREAM_WINDOW_BYTES);
    Box::new(GuardedNetwork::new(
        network,
        FrameReader::new(reader),
        written,
        limits,
        session,
    ))
}
