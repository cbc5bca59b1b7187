//! Calls to one capability are delivered in the order they were made
//! (E-order), whatever order the tasks that hold their promises are polled
//! in. capnp-rpc dispatches a call to a local object when its promise is
//! first polled; a server hands each incoming call to a task of its own,
//! and wakers decide which task runs first. Without an order kept at the
//! object, the chunks of an upload pipelined on `upload`'s sink could be
//! written swapped (seen: `capexec cp -` wrote a file's first two 256 KiB
//! chunks the other way round, and said nothing).

use std::cell::RefCell;
use std::rc::Rc;

use capexec::capexec_capnp::byte_sink;

/// A sink that records the chunks written to it, in the order it runs them.
struct Recorder {
    written: Rc<RefCell<Vec<Vec<u8>>>>,
}

impl byte_sink::Server for Recorder {
    async fn write(self: Rc<Self>, params: byte_sink::WriteParams) -> Result<(), capnp::Error> {
        let data = params.get()?.get_data()?.to_vec();
        self.written.borrow_mut().push(data);
        Ok(())
    }
}

/// A write made the way capexec streams (`wire::stream_call`): the call is
/// made when it is sent, not when its promise is first polled.
fn write(sink: &byte_sink::Client, data: &[u8]) -> capnp::capability::Promise<(), capnp::Error> {
    let size = capnp::MessageSize {
        word_count: 16,
        cap_count: 0,
    };
    let mut request = capexec::wire::stream_call::<byte_sink::write_params::Owned>(
        &sink.client,
        <byte_sink::Client as capnp::traits::HasTypeId>::TYPE_ID,
        0,
        size,
    );
    request.get().set_data(data);
    let promise = request.send().promise;
    capnp::capability::Promise::from_future(async move { promise.await.map(drop) })
}

fn run_local(test: impl std::future::Future<Output = ()>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    runtime.block_on(tokio::task::LocalSet::new().run_until(test));
}

#[test]
fn a_later_call_polled_first_still_runs_second() {
    run_local(async {
        let written = Rc::new(RefCell::new(Vec::new()));
        let sink: byte_sink::Client = capnp_rpc::new_client(Recorder {
            written: written.clone(),
        });
        let first = write(&sink, b"first");
        let second = write(&sink, b"second");
        // `join` polls its first argument first: the second call.
        let (second, first) = futures::join!(second, first);
        second.expect("second");
        first.expect("first");
        assert_eq!(*written.borrow(), [b"first".to_vec(), b"second".to_vec()]);
    });
}

#[test]
fn calls_queued_on_a_promise_and_made_after_it_resolved_keep_their_order() {
    run_local(async {
        let written = Rc::new(RefCell::new(Vec::new()));
        let (resolve, promised) = futures::channel::oneshot::channel::<byte_sink::Client>();
        let sink: byte_sink::Client = capnp_rpc::new_future_client(async move {
            promised
                .await
                .map_err(|_| capnp::Error::failed("never resolved".into()))
        });
        // As pipelined calls wait on an answer not given yet...
        let queued: Vec<_> = (0..4u8).map(|n| write(&sink, &[n])).collect();
        let target: byte_sink::Client = capnp_rpc::new_client(Recorder {
            written: written.clone(),
        });
        assert!(resolve.send(target.clone()).is_ok());
        // ...then the answer arrives (the waiting calls are passed on to
        // it) and the caller writes straight to it.
        sink.client.when_resolved().await.expect("resolved");
        let direct: Vec<_> = (4..8u8).map(|n| write(&target, &[n])).collect();
        // Poll the newest first.
        let all: Vec<_> = direct
            .into_iter()
            .rev()
            .chain(queued.into_iter().rev())
            .collect();
        for outcome in futures::future::join_all(all).await {
            outcome.expect("write");
        }
        let order: Vec<u8> = written.borrow().iter().map(|chunk| chunk[0]).collect();
        assert_eq!(order, (0..8u8).collect::<Vec<_>>());
    });
}

/// A sink whose release sets a flag.
struct Watched {
    released: Rc<std::cell::Cell<bool>>,
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.released.set(true);
    }
}

impl byte_sink::Server for Watched {}

/// A directory that does nothing: calls on it are only made, never run.
struct Idle;

impl capexec::capexec_capnp::directory::Server for Idle {}

#[test]
fn a_call_dropped_before_it_runs_lets_go_of_its_parameters_at_once() {
    run_local(async {
        let directory: capexec::capexec_capnp::directory::Client = capnp_rpc::new_client(Idle);
        let released = Rc::new(std::cell::Cell::new(false));
        let mut request = directory.download_request();
        request.get().set_sink(capnp_rpc::new_client(Watched {
            released: released.clone(),
        }));
        let unpolled = request.send().promise;
        assert!(!released.get(), "the call holds its sink");
        drop(unpolled);
        assert!(released.get(), "the dropped call let its sink go");
    });
}

/// An upload sink that records its writes and says when `done` came.
struct Upload {
    log: Rc<RefCell<Vec<String>>>,
}

impl capexec::capexec_capnp::upload_sink::Server for Upload {
    async fn write(
        self: Rc<Self>,
        params: capexec::capexec_capnp::upload_sink::WriteParams,
    ) -> Result<(), capnp::Error> {
        let data = params.get()?.get_data()?;
        self.log
            .borrow_mut()
            .push(String::from_utf8_lossy(data).into_owned());
        Ok(())
    }

    async fn done(
        self: Rc<Self>,
        _: capexec::capexec_capnp::upload_sink::DoneParams,
        _: capexec::capexec_capnp::upload_sink::DoneResults,
    ) -> Result<(), capnp::Error> {
        self.log.borrow_mut().push("done".into());
        Ok(())
    }
}

#[test]
fn a_streaming_call_nobody_polls_still_runs_before_the_call_after_it() {
    run_local(async {
        use capexec::capexec_capnp::upload_sink;
        let log = Rc::new(RefCell::new(Vec::new()));
        let sink: upload_sink::Client = capnp_rpc::new_client(Upload { log: log.clone() });
        let mut write = sink.write_request();
        write.get().set_data(b"chunk");
        // Sent, and its promise held without ever being polled.
        let _held = write.send();
        let done = tokio::time::timeout(
            std::time::Duration::from_secs(20),
            sink.done_request().send().promise,
        )
        .await
        .expect("done is not held up behind a write nobody polls");
        done.expect("done");
        assert_eq!(*log.borrow(), ["chunk", "done"]);
    });
}

#[test]
fn streaming_requests_keep_the_order_they_were_sent_in() {
    run_local(async {
        let written = Rc::new(RefCell::new(Vec::new()));
        let sink: byte_sink::Client = capnp_rpc::new_client(Recorder {
            written: written.clone(),
        });
        let sent: Vec<_> = (0..4u8)
            .map(|n| {
                let mut request = sink.write_request();
                request.get().set_data(&[n]);
                request.send()
            })
            .collect();
        for outcome in futures::future::join_all(sent.into_iter().rev()).await {
            outcome.expect("write");
        }
        let order: Vec<u8> = written.borrow().iter().map(|chunk| chunk[0]).collect();
        assert_eq!(order, [0, 1, 2, 3]);
    });
}
