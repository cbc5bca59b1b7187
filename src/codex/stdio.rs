//! The stdio transport of `capexec codex-bridge`, as `codex exec-server
//! --listen stdio` speaks it: one JSON message per line each way.

use std::io;

use futures::{Sink, SinkExt, Stream};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncWrite, BufReader};
use tokio_util::codec::{FramedWrite, LinesCodec, LinesCodecError};

/// The longest message read. A longer line is answered as a bad message,
/// skipped without being held, and serving goes on.
pub const LONGEST_MESSAGE: usize = 32 << 20;

const READ_BUFFER: usize = 64 << 10;

/// Each line of `input` as a message (empty lines skipped); an over-long
/// one as an `InvalidData` error, after which reading goes on.
pub fn messages(
    input: impl AsyncRead + Unpin + 'static,
) -> impl Stream<Item = io::Result<String>> + Unpin {
    let reader = BufReader::with_capacity(READ_BUFFER, input);
    Box::pin(futures::stream::unfold(Some(reader), |reader| async move {
        let mut reader = reader?;
        match next_message(&mut reader).await {
            Ok(Some(message)) => Some((Ok(message), Some(reader))),
            Ok(None) => None,
            Err(error) if error.kind() == io::ErrorKind::InvalidData => {
                Some((Err(error), Some(reader)))
            }
            Err(error) => Some((Err(error), None)),
        }
    }))
}

/// The next non-empty line, held only up to [`LONGEST_MESSAGE`] bytes.
async fn next_message(reader: &mut (impl AsyncBufRead + Unpin)) -> io::Result<Option<String>> {
    loop {
        let mut line = Vec::new();
        let mut too_long = false;
        let ended = loop {
            let buffer = reader.fill_buf().await?;
            if buffer.is_empty() {
                break true;
            }
            let (taken, complete) = match buffer.iter().position(|&byte| byte == b'\n') {
                Some(newline) => (newline, true),
                None => (buffer.len(), false),
            };
            if !too_long && line.len() + taken > LONGEST_MESSAGE {
                too_long = true;
                line = Vec::new();
            }
            if !too_long {
                line.extend_from_slice(&buffer[..taken]);
            }
            reader.consume(taken + usize::from(complete));
            if complete {
                break false;
            }
        };
        if too_long {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a message longer than {LONGEST_MESSAGE} bytes was skipped"),
            ));
        }
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        if line.is_empty() {
            if ended {
                return Ok(None);
            }
            continue;
        }
        return String::from_utf8(line).map(Some).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "a message that is not UTF-8 was skipped",
            )
        });
    }
}

/// Each message written to `output` as one line.
pub fn lines(output: impl AsyncWrite + Unpin) -> impl Sink<String, Error = io::Error> + Unpin {
    let framed: FramedWrite<_, LinesCodec> = FramedWrite::new(output, LinesCodec::new());
    SinkExt::<String>::sink_map_err(framed, |error| match error {
        LinesCodecError::Io(error) => error,
        LinesCodecError::MaxLineLengthExceeded => io::Error::other(error),
    })
}
