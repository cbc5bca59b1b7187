//! `capexec codex-bridge`: Codex's exec-server protocol on stdio, or on a
//! websocket with `--listen`, served from the embedded executor or a
//! capexec server (see `capexec::codex`).

use capexec::client;
use capexec::codex::{self, Bridge};

use crate::cli::{CodexBridgeArgs, EXIT_CAPEXEC_FAILURE, target};

/// How long a websocket client's lost session is kept for it to resume
/// (Codex's own server keeps a detached one 30 s).
const WS_KEEP_SESSION: std::time::Duration = std::time::Duration::from_secs(30);

pub fn main(args: CodexBridgeArgs) -> i32 {
    crate::cli::run_local(async move {
        match serve(args).await {
            Ok(()) => 0,
            Err(message) => {
                eprintln!("capexec: codex-bridge: {message}");
                EXIT_CAPEXEC_FAILURE
            }
        }
    })
}

async fn serve(args: CodexBridgeArgs) -> Result<(), String> {
    if let Some(root) = &args.root
        && !root.is_absolute()
    {
        return Err(format!(
            "--root {}: give an absolute path (it names a directory of the executor's machine)",
            root.display()
        ));
    }
    if args.ws_token_file.is_some() && args.listen.is_none() {
        return Err("--ws-token-file is the token of --listen ws://HOST:PORT".into());
    }
    let target = target::established_target(&args.connect).await?;
    let environment = args.environment.or_else(|| target.environment.clone());
    let executor = match &environment {
        Some(path) => client::environment(&target.executor, path),
        None => target.executor.clone(),
    };
    let served: std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>>>> =
        match &args.listen {
            Some(url) => {
                // A websocket client may reconnect and resume its session,
                // kept meanwhile as long as Codex's own server keeps one.
                let bridge = Bridge::new(executor, args.root, WS_KEEP_SESSION);
                Box::pin(codex::websocket::listen(
                    url,
                    args.ws_token_file.as_deref(),
                    move |inbound, outbound| {
                        let bridge = bridge.clone();
                        async move {
                            if let Err(error) =
                                codex::serve_connection(bridge, inbound, outbound).await
                            {
                                tracing::debug!(%error, "websocket connection ended");
                            }
                        }
                    },
                ))
            }
            None => {
                // Over stdio Codex never reconnects: the session ends with
                // stdin.
                let bridge = Bridge::new(executor, args.root, std::time::Duration::ZERO);
                let inbound = codex::stdio::messages(tokio::io::stdin());
                let outbound = codex::stdio::lines(tokio::io::stdout());
                Box::pin(async move {
                    codex::serve_connection(bridge, inbound, outbound)
                        .await
                        .map_err(|error| error.to_string())
                })
            }
        };
    // A bridge whose server is gone can serve nothing: it ends, so that
    // Codex sees its environment fail instead of waiting for events that
    // will never come.
    let lost = async {
        match &target.connection {
            Some(connection) => {
                connection.closed().await;
                connection.abort_reason().await
            }
            None => std::future::pending().await,
        }
    };
    let ended = tokio::select! {
        served = served => served,
        reason = lost => Err(match reason {
            Some(reason) => format!("lost the capexec server: {reason}"),
            None => "lost the capexec server: it closed the connection".to_string(),
        }),
    };
    // The connection (and with it every process the bridge held) goes
    // when `target` is dropped here.
    drop(target);
    ended
}
