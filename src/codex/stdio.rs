//! The stdio transport of `capexec codex-bridge`, as `codex exec-server
//! --listen stdio` speaks it: one JSON message per line each way.

use std::io;

use futures::{Sink, SinkExt, Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::{FramedRead, FramedWrite, LinesCodec, LinesCodecError};

/// The longest message read. A longer line is answered as a bad message,
/// skipped without being held, and serving goes on.
pub const LONGEST_MESSAGE: usize = 32 << 20;

/// Each line of `input` as a message; an over-long one as an
/// `InvalidData` error.
pub fn messages(input: impl AsyncRead + Unpin) -> impl Stream<Item = io::Result<String>> + Unpin {
    FramedRead::new(input, LinesCodec::new_with_max_length(LONGEST_MESSAGE)).map(|line| {
        line.map_err(|error| match error {
            LinesCodecError::MaxLineLengthExceeded => io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a message longer than {LONGEST_MESSAGE} bytes was skipped"),
            ),
            LinesCodecError::Io(error) => error,
        })
    })
}

/// Each message written to `output` as one line.
pub fn lines(output: impl AsyncWrite + Unpin) -> impl Sink<String, Error = io::Error> + Unpin {
    let framed: FramedWrite<_, LinesCodec> = FramedWrite::new(output, LinesCodec::new());
    SinkExt::<String>::sink_map_err(framed, |error| match error {
        LinesCodecError::Io(error) => error,
        LinesCodecError::MaxLineLengthExceeded => io::Error::other(error),
    })
}
