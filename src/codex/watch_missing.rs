//! `fs/watchMissing`: Codex asks to hear when any of some missing paths
//! appears (an `AGENTS.md` being created), or when a present one goes; the
//! bridge answers `fs/missingChanged{watchId}` once, as Codex's own server
//! does. Each path is watched through `Directory.watch` on its deepest
//! existing directory, one level at a time (never a recursive watch of a
//! whole tree), moving down as the missing directories appear.

use std::path::{Path, PathBuf};
use std::rc::Rc;

use futures::StreamExt;
use futures::future::{LocalBoxFuture, select_all};
use serde::Deserialize;
use serde_json::{Value, json};

use super::connection::{Answer, Connection, later, now};
use super::environment::Session;
use super::files::{Files, absolute};
use super::jsonrpc::{self, RpcError};

/// Watches one session may hold at once.
const WATCHES_PER_SESSION: usize = 64;

/// Paths one watch may name.
const PATHS_PER_WATCH: usize = 64;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatchMissing {
    watch_id: u64,
    missing: Vec<String>,
    #[serde(default)]
    present: Option<String>,
}

pub fn watch_missing(connection: &Rc<Connection>, session: &Rc<Session>, params: Value) -> Answer {
    let request: WatchMissing = match jsonrpc::params(params) {
        Ok(request) => request,
        Err(error) => return now(Err(error)),
    };
    let bridge = connection.bridge.clone();
    let session = session.clone();
    later(async move {
        let missing = request
            .missing
            .iter()
            .map(|uri| absolute(uri))
            .collect::<Result<Vec<_>, _>>()?;
        let present = request.present.as_deref().map(absolute).transpose()?;
        if missing.len() > PATHS_PER_WATCH {
            return Err(RpcError::invalid_params(format!(
                "a watch names at most {PATHS_PER_WATCH} paths"
            )));
        }
        let files = Rc::new(Files::new(&bridge));
        // Nothing to wait for: no missing path, one already there, or the
        // present one already gone.
        let mut watching = !missing.is_empty();
        for path in &missing {
            watching &= !files.exists(path).await?;
        }
        if let Some(present) = &present {
            watching &= files.exists(present).await?;
        }
        let mut watches = session.watches.borrow_mut();
        if !watching || watches.contains_key(&request.watch_id) {
            return Ok(json!({"watching": false}));
        }
        if watches.len() >= WATCHES_PER_SESSION {
            return Err(RpcError::invalid_request(format!(
                "a session holds at most {WATCHES_PER_SESSION} watches"
            )));
        }
        let watch_id = request.watch_id;
        let task = tokio::task::spawn_local(until_changed(
            files,
            session.clone(),
            watch_id,
            missing,
            present,
        ));
        watches.insert(watch_id, task.abort_handle());
        Ok(json!({"watching": true}))
    })
}

/// Waits for the first change, says it, and forgets the watch.
async fn until_changed(
    files: Rc<Files>,
    session: Rc<Session>,
    watch_id: u64,
    missing: Vec<PathBuf>,
    present: Option<PathBuf>,
) {
    let mut waits: Vec<LocalBoxFuture<'_, Result<(), RpcError>>> = missing
        .iter()
        .map(|path| Box::pin(appears(&files, path)) as LocalBoxFuture<'_, _>)
        .collect();
    if let Some(present) = &present {
        waits.push(Box::pin(goes(&files, present)));
    }
    let (changed, _, _) = select_all(waits).await;
    session.watches.borrow_mut().remove(&watch_id);
    if let Err(error) = changed {
        // The watch cannot go on (the executor is gone, a limit): Codex
        // looks again when it is told something changed.
        tracing::debug!(watch_id, %error.message, "a missing-path watch ended");
    }
    if let Some(outbound) = session.outbound().await {
        let _ = outbound
            .send(jsonrpc::notification(
                "fs/missingChanged",
                json!({"watchId": watch_id}),
            ))
            .await;
    }
}

/// Resolves once `path` exists.
async fn appears(files: &Files, path: &Path) -> Result<(), RpcError> {
    loop {
        if files.exists(path).await? {
            return Ok(());
        }
        let (ancestor, rest) = files.existing_ancestor(path).await?;
        let directory = files.directory_at(&ancestor)?;
        let mut events = directory
            .watch(".", false)
            .await
            .map_err(|error| RpcError::internal(error.to_string()))?;
        // What appeared before the watch began is seen by looking again.
        let next = ancestor.join(
            rest.components()
                .next()
                .map(|c| c.as_os_str())
                .unwrap_or_default(),
        );
        if files.exists(&next).await? {
            continue;
        }
        if events.next().await.is_none() {
            return Err(RpcError::internal(format!(
                "the watch of {} ended",
                ancestor.display()
            )));
        }
    }
}

/// Resolves once `path` no longer exists.
async fn goes(files: &Files, path: &Path) -> Result<(), RpcError> {
    let parent = path.parent().unwrap_or(Path::new("/"));
    let directory = files.directory_at(parent)?;
    let mut events = directory
        .watch(".", false)
        .await
        .map_err(|error| RpcError::internal(error.to_string()))?;
    loop {
        if !files.exists(path).await? {
            return Ok(());
        }
        if events.next().await.is_none() {
            return Err(RpcError::internal(format!(
                "the watch of {} ended",
                parent.display()
            )));
        }
    }
}
