//! Cap'n Proto two-party networks over tokio streams, tuned the same way on
//! both ends.

use capnp_rpc::rpc_twoparty_capnp::Side;
use capnp_rpc::twoparty::VatNetwork;
use futures::io::{BufReader, BufWriter};
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

use crate::net::guard::{CallLimits, GuardedNetwork};

/// Largest message accepted from a peer (in 8-byte words): far above any
/// legitimate message (a full `read` result is a few MiB) and far below
/// capnp's 64 MiB default, which an unauthenticated peer could otherwise use.
pub(crate) const RECEIVE_LIMIT_WORDS: usize = 2 << 20;

/// Flow-control window of each `-> stream` capability (event sinks): bytes
/// in flight before the sender waits for acknowledgements. Two pushes of
/// [`crate::rpc::PUSH_BUDGET_BYTES`]: one being consumed, one on the way.
pub(crate) const STREAM_WINDOW_BYTES: usize = 512 * 1024;

/// Buffers between the socket and capnp's serializer: a message's segment
/// table and small segments go out in one write, and reads are batched.
const IO_BUFFER_BYTES: usize = 64 * 1024;

/// A connection's network, ready for an `RpcSystem`.
pub(crate) type Network = Box<dyn capnp_rpc::VatNetwork<Side>>;

/// The two-party network over `reader` and `writer`, guarded by `limits`.
pub(crate) fn network<R, W>(reader: R, writer: W, side: Side, limits: CallLimits) -> Network
where
    R: tokio::io::AsyncRead + Unpin + 'static,
    W: tokio::io::AsyncWrite + Unpin + 'static,
{
    let mut options = capnp::message::ReaderOptions::new();
    options.traversal_limit_in_words(Some(RECEIVE_LIMIT_WORDS));
    let mut network = VatNetwork::new(
        BufReader::with_capacity(IO_BUFFER_BYTES, reader.compat()),
        BufWriter::with_capacity(IO_BUFFER_BYTES, writer.compat_write()),
        side,
        options,
    );
    network.set_window_size(STREAM_WINDOW_BYTES);
    Box::new(GuardedNetwork::new(network, limits))
}
