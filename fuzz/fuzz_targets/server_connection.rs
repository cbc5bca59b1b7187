//! Feeds arbitrary bytes to a served connection, as a hostile peer would,
//! then ends the input: the connection must end too, without a panic, and
//! leave no process behind.
#![no_main]

use std::time::Duration;

use capexec::engine::Engine;
use capexec::net::{CallLimits, serve_stream};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fuzz_target!(|input: &[u8]| {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    tokio::task::LocalSet::new().block_on(&runtime, async {
        let engine = Engine::default();
        let executor = capexec::rpc::local_executor(engine.clone());
        let (near, far) = tokio::io::duplex(1 << 20);
        let (reader, writer) = tokio::io::split(far);
        let served = tokio::task::spawn_local(serve_stream(
            reader,
            writer,
            executor,
            CallLimits::default(),
        ));
        let (mut replies, mut requests) = tokio::io::split(near);
        tokio::task::spawn_local(async move {
            let mut sink = vec![0u8; 64 << 10];
            while matches!(replies.read(&mut sink).await, Ok(n) if n > 0) {}
        });
        let _ = requests.write_all(input).await;
        let _ = requests.shutdown().await;
        tokio::time::timeout(Duration::from_secs(20), served)
            .await
            .expect("the connection ended with its input")
            .expect("the connection task did not panic");
        engine.shutdown().await;
        assert_eq!(engine.live_count(), 0);
    });
});
