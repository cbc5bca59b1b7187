//! A hop forwards whole messages: a field the far end sets reaches the
//! client even if this server's schema does not know it yet (the schema's
//! compatibility rules let a newer far end add fields). The far end here
//! is an executor of a future version, answering `info` with one data
//! word and one pointer beyond today's `ExecutorInfo`; a capexec server
//! forwards to it, and the client reads both through the hop, alongside
//! what the hop itself changes (its environment path).

use std::path::Path;
use std::rc::Rc;

use capexec::capexec_capnp::{executor, executor_info};
use capexec::model::ExecutorInfo;
use capexec::net::{Address, UpstreamConfig};
use capnp::private::layout::{PointerBuilder, StructSize};
use capnp::traits::HasStructSize;
use capnp_rpc::rpc_twoparty_capnp::Side;
use capnp_rpc::{RpcSystem, twoparty};

use crate::common::data::TempDir;
use crate::common::server::ServerThread;

/// What the far end puts beyond today's fields.
const FUTURE_WORD: u64 = 0x00C0_FFEE_0000_0042;
const FUTURE_TEXT: &str = "a field of a future version";

/// A message's root pointer, to make a struct of any size there.
struct RootPointer<'a>(PointerBuilder<'a>);

impl<'a> capnp::traits::FromPointerBuilder<'a> for RootPointer<'a> {
    fn init_pointer(builder: PointerBuilder<'a>, _: u32) -> Self {
        RootPointer(builder)
    }
    fn get_from_pointer(
        builder: PointerBuilder<'a>,
        _: Option<&'a [capnp::Word]>,
    ) -> capnp::Result<Self> {
        Ok(RootPointer(builder))
    }
}

/// Today's `ExecutorInfo` grown by one data word and one pointer, set.
fn future_info() -> capnp::message::Builder<capnp::message::HeapAllocator> {
    let today = executor_info::Builder::STRUCT_SIZE;
    let mut message = capnp::message::Builder::new_default();
    let root: RootPointer<'_> = message.init_root();
    let mut grown = root.0.init_struct(StructSize {
        data: today.data + 1,
        pointers: today.pointers + 1,
    });
    grown.set_data_field::<u64>(usize::from(today.data), FUTURE_WORD);
    grown
        .reborrow()
        .get_pointer_field(usize::from(today.pointers))
        .set_text(FUTURE_TEXT.into());
    let info = ExecutorInfo {
        version: "99.0.0".into(),
        features: Vec::new(),
        os: "linux".into(),
        arch: "x86_64".into(),
        hostname: "future".into(),
        default_shell: "/bin/sh".into(),
        cwd: "/".into(),
        temp_dir: "/tmp".into(),
        environment: "local".into(),
    };
    capexec::wire::info_to_wire(&info, executor_info::Builder::from(grown));
    message
}

struct FutureExecutor;

impl executor::Server for FutureExecutor {
    async fn info(
        self: Rc<Self>,
        _: executor::InfoParams,
        mut results: executor::InfoResults,
    ) -> Result<(), capnp::Error> {
        let info = future_info();
        results
            .get()
            .set_info(info.get_root_as_reader::<executor_info::Reader<'_>>()?)
    }
}

/// Serves [`FutureExecutor`] as the bootstrap of every connection to
/// `socket`, on a thread of its own, for the life of the test process.
fn serve_future_executor(socket: &Path) {
    let listener = std::os::unix::net::UnixListener::bind(socket).expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        tokio::task::LocalSet::new().block_on(&runtime, async move {
            let listener = tokio::net::UnixListener::from_std(listener).expect("listener");
            while let Ok((stream, _)) = listener.accept().await {
                use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};
                let (reader, writer) = stream.into_split();
                let network = twoparty::VatNetwork::new(
                    futures::io::BufReader::new(reader.compat()),
                    writer.compat_write(),
                    Side::Server,
                    Default::default(),
                );
                let bootstrap: executor::Client = capnp_rpc::new_client(FutureExecutor);
                tokio::task::spawn_local(RpcSystem::new(Box::new(network), Some(bootstrap.client)));
            }
        });
    });
}

/// The data word and text beyond today's fields of `info`, as read.
fn beyond_today(info: executor_info::Reader<'_>) -> (u64, String) {
    let today = executor_info::Builder::STRUCT_SIZE;
    let raw = capnp::traits::IntoInternalStructReader::into_internal_struct_reader(info);
    let word = raw.get_data_field::<u64>(usize::from(today.data));
    let text = raw
        .get_pointer_field(usize::from(today.pointers))
        .get_text(None)
        .ok()
        .and_then(|text| text.to_string().ok())
        .unwrap_or_default();
    (word, text)
}

#[test]
fn a_field_the_far_end_sets_reaches_the_client_through_a_hop() {
    let dir = TempDir::new("future-far-end");
    let far = dir.path().join("far.sock");
    serve_future_executor(&far);
    let front = ServerThread::start_forwarding(
        TempDir::new("front-of-future"),
        vec![Address::Unix(dir.path().join("front.sock"))],
        vec![UpstreamConfig::new("far", Address::Unix(far), None)],
        Some("far"),
    );
    crate::common::run_local(async move {
        let Address::Unix(path) = &front.address else {
            panic!("a Unix socket");
        };
        let stream = tokio::net::UnixStream::connect(path)
            .await
            .expect("connect");
        let (reader, writer) = stream.into_split();
        let mut system = crate::common::raw_client_system(reader, writer);
        let executor: executor::Client = system.bootstrap(Side::Server);
        tokio::task::spawn_local(system);
        let response = executor
            .info_request()
            .send()
            .promise
            .await
            .expect("info through the hop");
        let info = response.get().expect("results").get_info().expect("info");
        assert_eq!(
            beyond_today(info),
            (FUTURE_WORD, FUTURE_TEXT.to_string()),
            "what the far end set beyond today's schema"
        );
        // What the hop changes of it, it changed; the rest is the far end's.
        assert_eq!(info.get_environment().expect("text").to_str(), Ok("far"));
        assert_eq!(info.get_hostname().expect("text").to_str(), Ok("future"));
        assert_eq!(info.get_version().expect("text").to_str(), Ok("99.0.0"));
    });
}
