//! Calls to a `-> stream` method with a window of unacknowledged bytes,
//! sent as ordinary calls so that each acknowledgement is seen: the
//! sender knows when everything it pushed has arrived (capnp-rpc's own
//! streaming keeps that to itself), and a failure of any push surfaces at
//! the next send or at [`Window::drain`]. The receiver still runs them one
//! at a time, in order (the method is declared `-> stream`).

use std::future::Future;
use std::pin::Pin;

use futures::StreamExt;
use futures::stream::FuturesOrdered;

/// Unacknowledged bytes a transfer keeps on the way: four chunks of 256
/// KiB, enough to keep a fast link busy, bounded on both ends.
pub const TRANSFER_WINDOW_BYTES: usize = 1024 * 1024;

type Ack = Pin<Box<dyn Future<Output = Result<usize, capnp::Error>>>>;

pub struct Window {
    in_flight: FuturesOrdered<Ack>,
    bytes: usize,
    limit: usize,
}

impl Window {
    pub fn new(limit: usize) -> Window {
        Window {
            in_flight: FuturesOrdered::new(),
            bytes: 0,
            limit,
        }
    }

    /// Counts `call` (carrying `bytes`), waiting while the window is full.
    pub async fn send<T: 'static>(
        &mut self,
        call: impl Future<Output = Result<T, capnp::Error>> + 'static,
        bytes: usize,
    ) -> Result<(), capnp::Error> {
        // Spawned, so that it makes progress while nobody waits for it (a
        // call to a local capability runs only when polled).
        let call = tokio::task::spawn_local(async move { call.await.map(|_| bytes) });
        self.in_flight.push_back(Box::pin(async move {
            call.await.unwrap_or_else(|error| {
                Err(capnp::Error::failed(format!("a push failed: {error}")))
            })
        }));
        self.bytes += bytes;
        while self.bytes >= self.limit {
            self.settle().await?;
        }
        Ok(())
    }

    async fn settle(&mut self) -> Result<(), capnp::Error> {
        if let Some(acknowledged) = self.in_flight.next().await {
            self.bytes -= acknowledged?;
        } else {
            self.bytes = 0;
        }
        Ok(())
    }

    /// Waits until every call was acknowledged.
    pub async fn drain(&mut self) -> Result<(), capnp::Error> {
        while !self.in_flight.is_empty() {
            self.settle().await?;
        }
        Ok(())
    }
}

/// A request for method `method` of `interface` (a `-> stream` method of
/// the capability `client`), sized `size`, whose answer is ignored.
pub fn stream_call<Params: capnp::traits::Owned>(
    client: &capnp::capability::Client,
    interface: u64,
    method: u16,
    size: capnp::MessageSize,
) -> capnp::capability::Request<Params, capnp::any_pointer::Owned> {
    client.new_call(interface, method, Some(size))
}
