//! Copying two connections into each other, both directions at once, as a
//! forward does: end of file in one direction half-closes the other side
//! while the opposite direction goes on; a failure in either stops both.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Bytes read at once from either side.
pub const SPLICE_BUFFER_BYTES: usize = 64 * 1024;

/// Which way bytes were going when a splice failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From the first side into the second.
    Forward,
    /// From the second side into the first.
    Backward,
}

/// How a splice failed: the direction, and whether reading or writing.
#[derive(Debug)]
pub struct SpliceError {
    pub direction: Direction,
    pub reading: bool,
    pub error: io::Error,
}

impl std::fmt::Display for SpliceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", crate::model::io_message(&self.error))
    }
}

/// What each direction carried.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Spliced {
    pub forward: u64,
    pub backward: u64,
}

/// Copies `a` into `b` and `b` into `a` until both directions reached end
/// of file (each half-closing its writer), or one fails.
pub async fn splice<AR, AW, BR, BW>(
    a_read: AR,
    a_write: AW,
    b_read: BR,
    b_write: BW,
) -> Result<Spliced, SpliceError>
where
    AR: AsyncRead + Unpin,
    AW: AsyncWrite + Unpin,
    BR: AsyncRead + Unpin,
    BW: AsyncWrite + Unpin,
{
    let forward = copy_half(a_read, b_write, Direction::Forward);
    let backward = copy_half(b_read, a_write, Direction::Backward);
    let (forward, backward) = futures::future::try_join(forward, backward).await?;
    Ok(Spliced { forward, backward })
}

async fn copy_half<R, W>(
    mut reader: R,
    mut writer: W,
    direction: Direction,
) -> Result<u64, SpliceError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let failed = |reading, error| SpliceError {
        direction,
        reading,
        error,
    };
    let mut buffer = vec![0u8; SPLICE_BUFFER_BYTES];
    let mut total = 0u64;
    loop {
        let read = reader
            .read(&mut buffer)
            .await
            .map_err(|error| failed(true, error))?;
        if read == 0 {
            writer
                .shutdown()
                .await
                .map_err(|error| failed(false, error))?;
            return Ok(total);
        }
        writer
            .write_all(&buffer[..read])
            .await
            .map_err(|error| failed(false, error))?;
        total += read as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn both_directions_flow_and_end_of_file_half_closes() {
        let (a, mut a_peer) = tokio::io::duplex(1024);
        let (b, mut b_peer) = tokio::io::duplex(1024);
        let (a_read, a_write) = tokio::io::split(a);
        let (b_read, b_write) = tokio::io::split(b);
        let spliced = tokio::spawn(splice(a_read, a_write, b_read, b_write));
        a_peer.write_all(b"to b").await.expect("write");
        a_peer.shutdown().await.expect("half-close");
        let mut got = Vec::new();
        b_peer.read_to_end(&mut got).await.expect("read b");
        assert_eq!(got, b"to b");
        // The other direction still works after the first ended.
        b_peer.write_all(b"to a, later").await.expect("write");
        b_peer.shutdown().await.expect("half-close");
        let mut got = Vec::new();
        a_peer.read_to_end(&mut got).await.expect("read a");
        assert_eq!(got, b"to a, later");
        let spliced = spliced.await.expect("join").expect("splice");
        assert_eq!(
            spliced,
            Spliced {
                forward: 4,
                backward: 11
            }
        );
    }
}
