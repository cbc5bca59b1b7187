//! `fs/*`: Codex's file calls on the executor's machine, through
//! `Directory` capabilities. Codex names absolute paths; without `--root`
//! each call opens the directory that holds its path by its absolute
//! name (so a call crosses mount points and follows symlinks as a local
//! program would, within what the executor may reach), and with `--root`
//! every path must lie beneath the root and is resolved beneath it by the
//! executor's kernel.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use futures::StreamExt;
use serde_json::{Value, json};

use super::Bridge;
use super::connection::{Answer, Connection, later};
use super::jsonrpc::{self, RpcError};
use super::protocol::{
    Copy, CreateDirectory, HandleOnly, Open, PathOnly, ReadBlock, Remove, Walk, WriteFile,
};
use super::sandbox_intent::{Access, ExecutorTree, IntentError, Tree, confinement_for};
use super::uri;
use crate::capexec_capnp::executor;
use crate::client::follow::MAX_LINKS_FOLLOWED;
use crate::client::{self, Directory};
use crate::model::{CopyOptions, FileKind, FileStat, RefusalKind, WalkOptions};

/// The largest file `fs/readFile` returns in one answer; past it Codex
/// reads with `fs/open` and `fs/readBlock`.
const LARGEST_READ_FILE: u64 = 64 << 20;

/// The largest block `fs/readBlock` returns (capexec's one-call read).
const LARGEST_BLOCK: u64 = 4 << 20;

/// Open handles one connection may hold.
const HANDLES_PER_CONNECTION: usize = 256;

/// Entries `fs/readDirectory` and `fs/walk` return at most.
const LARGEST_LISTING: usize = 200_000;

/// The files of one connection, and its open handles.
pub struct Files {
    executor: executor::Client,
    root: Option<(PathBuf, Directory)>,
    handles: RefCell<HashMap<String, Rc<Located>>>,
}

/// A path as a directory and a name in it.
struct Located {
    directory: Directory,
    name: PathBuf,
    /// The absolute path, for answers and messages.
    path: PathBuf,
}

impl Files {
    /// The directory files are served beneath (the bridge's `--root`, or
    /// a confined call's planned root).
    fn served_root(&self) -> Option<&Path> {
        self.root.as_ref().map(|(root, _)| root.as_path())
    }

    pub fn new(bridge: &Bridge) -> Files {
        let root = bridge
            .root
            .as_ref()
            .map(|root| (root.clone(), Directory::open(&bridge.executor, root)));
        Files {
            executor: bridge.executor.clone(),
            root,
            handles: RefCell::new(HashMap::new()),
        }
    }

    pub fn dispatch(&self, connection: &Rc<Connection>, method: &str, params: Value) -> Answer {
        let connection = connection.clone();
        let method = method.to_string();
        if let Some(sandbox) = params.get("sandbox").filter(|sandbox| !sandbox.is_null()) {
            let sandbox = sandbox.clone();
            return later(
                async move { connection.files.confined(&method, params, &sandbox).await },
            );
        }
        later(async move { connection.files.call(&method, params).await })
    }

    /// A call with Codex's sandbox intent: made through a `Files` rooted at
    /// the planned root that allows it (`sandbox_intent::Plan`), within
    /// `--root` too; refused where the intent does not allow it.
    async fn confined(
        &self,
        method: &str,
        params: Value,
        sandbox: &Value,
    ) -> Result<Value, RpcError> {
        let need = match method {
            "fs/writeFile" | "fs/createDirectory" | "fs/remove" => Access::Write,
            "fs/getMetadata" | "fs/readFile" | "fs/readDirectory" | "fs/walk"
            | "fs/canonicalize" => Access::Read,
            // A handle was confined when it was opened.
            "fs/readBlock" | "fs/close" => return self.call(method, params).await,
            "fs/open" => {
                let open: Open = jsonrpc::params(params)?;
                let path = absolute(&open.path)?;
                let file = match self.confined_files(sandbox, &path, Access::Read).await? {
                    Some(confined) => confined.regular_file(&open.path).await?.0,
                    None => self.regular_file(&open.path).await?.0,
                };
                return self.keep_handle(open.handle_id, file);
            }
            "fs/copy" => {
                // Beneath the root that may be written at the destination;
                // a source outside it is refused by `copy` itself.
                let copy: Copy = jsonrpc::params(params)?;
                let destination = absolute(&copy.destination_path)?;
                return match self
                    .confined_files(sandbox, &destination, Access::Write)
                    .await?
                {
                    Some(confined) => confined.copy(copy).await,
                    None => self.copy(copy).await,
                };
            }
            other => return Err(RpcError::unknown_method(other)),
        };
        let path = absolute(
            params
                .get("path")
                .and_then(Value::as_str)
                .ok_or_else(|| RpcError::invalid_params("path is missing"))?,
        )?;
        let recursive = params
            .get("recursive")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        if (method == "fs/createDirectory" && recursive) || method == "fs/writeFile" {
            self.missing_top_of_split(sandbox, &path, method == "fs/createDirectory")
                .await?;
        }
        match self.confined_files(sandbox, &path, need).await? {
            Some(confined) => confined.call(method, params).await,
            None => self.call(method, params).await,
        }
    }

    /// For a call on `path` beneath a directory split from a writable root
    /// (a workspace with `.git`) whose entry on the way is missing: a
    /// recursive `fs/createDirectory` (`make`) makes that entry first, by
    /// its one name in the split directory (failing if anything appeared
    /// there), so that the rest is made beneath it as a root of its own
    /// once planned again; an `fs/writeFile` is answered that the parent is
    /// missing, as a local write would be (Codex then makes the parents).
    /// Nothing on the way is followed through the split directory.
    async fn missing_top_of_split(
        &self,
        sandbox: &Value,
        path: &Path,
        make: bool,
    ) -> Result<(), RpcError> {
        let refused = |error: IntentError| RpcError::new(error.code(), error.message());
        let Some(confinement) = confinement_for(Some(sandbox), path, false).map_err(refused)?
        else {
            return Ok(());
        };
        let confinement = confinement.within(self.served_root());
        let plan = confinement
            .plan(&ExecutorTree::new(self.executor.clone()), None)
            .await
            .map_err(refused)?;
        if plan.access_at(path) == Access::Write {
            return Ok(());
        }
        let Some(split) = plan
            .splits
            .iter()
            .filter(|split| path.starts_with(&split.path) && path != split.path)
            .max_by_key(|split| split.path.components().count())
        else {
            return Ok(());
        };
        let Some(first) = path
            .strip_prefix(&split.path)
            .ok()
            .and_then(|rest| rest.iter().next())
        else {
            return Ok(());
        };
        let top = split.path.join(first);
        if top == path || plan.top_of_split(&top).is_none() {
            return Ok(());
        }
        let tree = ExecutorTree::new(self.executor.clone());
        if tree.kind(&top).await.map_err(RpcError::internal)?.is_some() {
            return Ok(());
        }
        if !make {
            return Err(RpcError::not_found(format!(
                "{}: No such file or directory (its directory {} is missing)",
                path.display(),
                top.display()
            )));
        }
        if let Some(files) = self.confined_files(sandbox, &top, Access::Write).await? {
            // Already there (made meanwhile): the call plans again and
            // finds what it is; anything else is said by the call itself.
            let _ = files
                .create_directory(CreateDirectory {
                    path: uri::from_path(&top),
                    recursive: Some(false),
                })
                .await;
        }
        Ok(())
    }

    /// The files `sandbox` lets a call reach at `path` with `need`: a
    /// `Files` rooted at the planned root that allows it (within `--root`
    /// too), or `None` when the intent confines nothing.
    async fn confined_files(
        &self,
        sandbox: &Value,
        path: &Path,
        need: Access,
    ) -> Result<Option<Files>, RpcError> {
        let refused = |error: IntentError| RpcError::new(error.code(), error.message());
        let Some(confinement) = confinement_for(Some(sandbox), path, false).map_err(refused)?
        else {
            return Ok(None);
        };
        let confinement = confinement.within(self.served_root());
        let plan = confinement
            .plan(&ExecutorTree::new(self.executor.clone()), None)
            .await
            .map_err(refused)?;
        let (root, access, directory) = plan
            .confined_root(&self.executor, path, need)
            .await
            .map_err(refused)?;
        let root = match &self.root {
            None => (root, directory),
            // Within --root as well: the narrower of the two.
            Some((served, served_directory)) => {
                beneath(served, path)?;
                let narrowed = if served.starts_with(&root) {
                    (served.clone(), served_directory.clone())
                } else {
                    let inner = served_directory.subdirectory(beneath(served, &root)?);
                    (root, inner)
                };
                match access {
                    Access::Write => narrowed,
                    _ => (narrowed.0, narrowed.1.read_only()),
                }
            }
        };
        Ok(Some(Files {
            executor: self.executor.clone(),
            root: Some(root),
            handles: RefCell::new(HashMap::new()),
        }))
    }

    async fn call(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        let files = self;
        match method {
            "fs/getMetadata" => files.metadata(jsonrpc::params(params)?).await,
            "fs/readFile" => files.read_file(jsonrpc::params(params)?).await,
            "fs/writeFile" => files.write_file(jsonrpc::params(params)?).await,
            "fs/readDirectory" => files.read_directory(jsonrpc::params(params)?).await,
            "fs/createDirectory" => files.create_directory(jsonrpc::params(params)?).await,
            "fs/remove" => files.remove(jsonrpc::params(params)?).await,
            "fs/copy" => files.copy(jsonrpc::params(params)?).await,
            "fs/walk" => files.walk(jsonrpc::params(params)?).await,
            "fs/canonicalize" => files.canonicalize(jsonrpc::params(params)?).await,
            "fs/open" => files.open(jsonrpc::params(params)?).await,
            "fs/readBlock" => files.read_block(jsonrpc::params(params)?).await,
            "fs/close" => files.close(jsonrpc::params(params)?),
            other => Err(RpcError::unknown_method(other)),
        }
    }

    /// `path` as a directory and a name; with `follow`, a final symlink
    /// is followed (the root's kernel does it beneath `--root`).
    async fn locate(&self, uri_text: &str, follow: bool) -> Result<Located, RpcError> {
        let path = absolute(uri_text)?;
        self.locate_path(path, follow).await
    }

    async fn locate_path(&self, path: PathBuf, follow: bool) -> Result<Located, RpcError> {
        if let Some((root, directory)) = &self.root {
            let name = beneath(root, &path)?;
            return Ok(Located {
                directory: directory.clone(),
                name,
                path,
            });
        }
        let path = if follow {
            followed(&self.executor, &path).await?
        } else {
            path
        };
        let (parent, name) = client::parent_and_name(&path);
        Ok(Located {
            directory: Directory::open(&self.executor, &parent),
            name,
            path,
        })
    }

    /// The directory `uri_text` names itself, its symlinks followed.
    async fn directory(&self, uri_text: &str) -> Result<(Directory, PathBuf), RpcError> {
        let path = absolute(uri_text)?;
        if let Some((root, directory)) = &self.root {
            let name = beneath(root, &path)?;
            return Ok((directory.subdirectory(&name), path));
        }
        let path = followed(&self.executor, &path).await?;
        Ok((Directory::open(&self.executor, &path), path))
    }

    async fn metadata(&self, params: PathOnly) -> Result<Value, RpcError> {
        let link = self.locate(&params.path, false).await?;
        let own = link
            .directory
            .symlink_metadata(&link.name)
            .await
            .map_err(|error| failed(&error))?;
        let stat = if own.kind == FileKind::Symlink {
            let target = self.locate_path(link.path.clone(), true).await?;
            target
                .directory
                .metadata(&target.name)
                .await
                .map_err(|error| failed(&error))?
        } else {
            own.clone()
        };
        Ok(json!({
            "isDirectory": stat.kind == FileKind::Directory,
            "isFile": stat.kind == FileKind::File,
            "isSymlink": own.kind == FileKind::Symlink,
            "size": stat.size,
            "createdAtMs": 0,
            "modifiedAtMs": stat.modified_ns.div_euclid(1_000_000),
        }))
    }

    /// The regular file `uri_text` names, its symlinks followed.
    async fn regular_file(&self, uri_text: &str) -> Result<(Located, FileStat), RpcError> {
        let file = self.locate(uri_text, true).await?;
        let stat = file
            .directory
            .metadata(&file.name)
            .await
            .map_err(|error| failed(&error))?;
        if stat.kind != FileKind::File {
            return Err(not_a_file(&file.path));
        }
        Ok((file, stat))
    }

    async fn read_file(&self, params: PathOnly) -> Result<Value, RpcError> {
        let (file, stat) = self.regular_file(&params.path).await?;
        if stat.size > LARGEST_READ_FILE {
            return Err(RpcError::invalid_request(format!(
                "`{}` is {} bytes, more than fs/readFile returns ({LARGEST_READ_FILE}): read it with fs/open and fs/readBlock",
                file.path.display(),
                stat.size
            )));
        }
        let data = file
            .directory
            .read(&file.name)
            .await
            .map_err(|error| failed(&error))?;
        Ok(json!({"dataBase64": BASE64.encode(data)}))
    }

    async fn write_file(&self, params: WriteFile) -> Result<Value, RpcError> {
        let data = BASE64
            .decode(params.data_base64.as_bytes())
            .map_err(|error| RpcError::invalid_request(format!("dataBase64: {error}")))?;
        // A symlink is written through, as a local write would.
        let file = match self.locate(&params.path, true).await {
            Err(error) if error.code == jsonrpc::NOT_FOUND => {
                self.locate(&params.path, false).await?
            }
            other => other?,
        };
        file.directory
            .write(&file.name, data)
            .await
            .map_err(|error| failed(&error))?;
        Ok(json!({}))
    }

    async fn read_directory(&self, params: PathOnly) -> Result<Value, RpcError> {
        let (directory, base) = self.directory(&params.path).await?;
        let mut listing = directory.read_dir(".").await;
        let mut entries = Vec::new();
        while let Some(entry) = listing.next().await {
            let entry = entry.map_err(|error| failed(&error))?;
            if entries.len() == LARGEST_LISTING {
                return Err(RpcError::invalid_request(format!(
                    "the directory holds more than {LARGEST_LISTING} entries"
                )));
            }
            let mut kind = entry.stat.as_ref().map(|stat| stat.kind);
            if kind == Some(FileKind::Symlink) {
                // Told as what it leads to, as a local listing that
                // follows links would.
                let path = base.join(OsStr::from_bytes(&entry.path));
                kind = match self.locate_path(path, true).await {
                    Ok(target) => target
                        .directory
                        .metadata(&target.name)
                        .await
                        .ok()
                        .map(|stat| stat.kind),
                    Err(_) => None,
                };
            }
            entries.push(json!({
                "fileName": OsStr::from_bytes(&entry.path).to_string_lossy(),
                "isDirectory": kind == Some(FileKind::Directory),
                "isFile": kind == Some(FileKind::File),
            }));
        }
        Ok(json!({"entries": entries}))
    }

    async fn create_directory(&self, params: CreateDirectory) -> Result<Value, RpcError> {
        let recursive = params.recursive.unwrap_or(true);
        let path = absolute(&params.path)?;
        if recursive && self.root.is_none() {
            // The parents may be missing: start from the deepest one there.
            let (ancestor, rest) = self.existing_ancestor(&path).await?;
            if rest.as_os_str().is_empty() {
                return Ok(json!({}));
            }
            Directory::open(&self.executor, &ancestor)
                .create_dir_with(&rest, true, 0o777)
                .await
                .map_err(|error| failed(&error))?;
            return Ok(json!({}));
        }
        let place = self.locate_path(path, false).await?;
        place
            .directory
            .create_dir_with(&place.name, recursive, 0o777)
            .await
            .map_err(|error| failed(&error))?;
        Ok(json!({}))
    }

    /// The directory at absolute `path` (beneath the root with `--root`).
    pub fn directory_at(&self, path: &Path) -> Result<Directory, RpcError> {
        match &self.root {
            Some((root, directory)) => Ok(directory.subdirectory(beneath(root, path)?)),
            None => Ok(Directory::open(&self.executor, path)),
        }
    }

    /// Whether `path` exists (a symlink counts, wherever it leads).
    pub async fn exists(&self, path: &Path) -> Result<bool, RpcError> {
        let place = self.locate_path(path.to_path_buf(), false).await?;
        match place.directory.exists(&place.name).await {
            Ok(exists) => Ok(exists),
            // A missing or non-directory parent: the path is not there.
            Err(error)
                if matches!(
                    error.refusal_kind(),
                    Some(RefusalKind::NotFound | RefusalKind::NotADirectory)
                ) =>
            {
                Ok(false)
            }
            Err(error) => Err(failed(&error)),
        }
    }

    /// The deepest existing directory above `path` (or `path` itself) and
    /// what remains of `path` beneath it.
    pub async fn existing_ancestor(&self, path: &Path) -> Result<(PathBuf, PathBuf), RpcError> {
        let mut ancestor = path.to_path_buf();
        let mut rest = PathBuf::new();
        loop {
            match self.directory_at(&ancestor)?.info().await {
                Ok(_) => return Ok((ancestor, rest)),
                Err(error)
                    if matches!(
                        error.refusal_kind(),
                        Some(RefusalKind::NotFound | RefusalKind::NotADirectory)
                    ) => {}
                Err(error) => return Err(failed(&error)),
            }
            let Some(name) = ancestor.file_name().map(PathBuf::from) else {
                return Err(RpcError::not_found(format!(
                    "{}: no directory above it exists",
                    path.display()
                )));
            };
            rest = name.join(rest);
            ancestor.pop();
        }
    }

    async fn remove(&self, params: Remove) -> Result<Value, RpcError> {
        let place = self.locate(&params.path, false).await?;
        place
            .directory
            .remove(
                &place.name,
                params.recursive.unwrap_or(true),
                params.force.unwrap_or(true),
            )
            .await
            .map_err(|error| failed(&error))?;
        Ok(json!({}))
    }

    async fn copy(&self, params: Copy) -> Result<Value, RpcError> {
        let source = absolute(&params.source_path)?;
        let destination = absolute(&params.destination_path)?;
        let (directory, base) = match &self.root {
            Some((root, directory)) => (directory.clone(), root.clone()),
            None => {
                let base = common_ancestor(&source, &destination);
                (Directory::open(&self.executor, &base), base)
            }
        };
        let from = beneath(&base, &source)?;
        let to = beneath(&base, &destination)?;
        let stat = directory
            .metadata(&from)
            .await
            .map_err(|error| failed(&error))?;
        if stat.kind == FileKind::Directory && !params.recursive {
            return Err(RpcError::invalid_request(
                "fs/copy requires recursive: true when sourcePath is a directory",
            ));
        }
        let options = CopyOptions {
            recursive: params.recursive,
            no_replace: false,
            preserve: false,
        };
        directory
            .copy(&from, &to, &options)
            .await
            .map_err(|error| failed(&error))?;
        Ok(json!({}))
    }

    async fn walk(&self, params: Walk) -> Result<Value, RpcError> {
        let (directory, base) = self.directory(&params.path).await?;
        let options = WalkOptions {
            max_depth: params.options.max_depth.max(1),
            max_entries: 0,
            include: Vec::new(),
            exclude: Vec::new(),
        };
        let limit = usize::try_from(params.options.max_entries)
            .unwrap_or(usize::MAX)
            .min(LARGEST_LISTING);
        let mut walk = directory.walk(".", &options).await;
        let (mut entries, mut errors) = (Vec::new(), Vec::new());
        let mut directories = 0u64;
        let mut truncated = false;
        while let Some(entry) = walk.next().await {
            let entry = entry.map_err(|error| failed(&error))?;
            let relative = PathBuf::from(OsStr::from_bytes(&entry.path));
            if params.options.prune_hidden_directories && under_hidden_directory(&relative) {
                continue;
            }
            if let Some(error) = &entry.error {
                errors
                    .push(json!({"path": uri::from_path(&base.join(&relative)), "message": error}));
                continue;
            }
            let kind = match entry.stat.as_ref().map(|stat| stat.kind) {
                Some(FileKind::Directory) => {
                    directories += 1;
                    "directory"
                }
                Some(FileKind::File) => "file",
                _ => continue,
            };
            if entries.len() >= limit || directories > params.options.max_directories {
                truncated = true;
                break;
            }
            entries.push(json!({"path": uri::from_path(&base.join(&relative)), "kind": kind}));
        }
        Ok(json!({"entries": entries, "errors": errors, "truncated": truncated}))
    }

    async fn canonicalize(&self, params: PathOnly) -> Result<Value, RpcError> {
        let path = absolute(&params.path)?;
        let canonical = match &self.root {
            Some((root, directory)) => {
                let name = beneath(root, &path)?;
                let resolved = directory
                    .canonicalize(&name)
                    .await
                    .map_err(|error| failed(&error))?;
                root.join(OsStr::from_bytes(&resolved))
            }
            None => canonical(&self.executor, &path).await?,
        };
        Ok(json!({"path": uri::from_path(&canonical)}))
    }

    async fn open(&self, params: Open) -> Result<Value, RpcError> {
        let (file, _) = self.regular_file(&params.path).await?;
        self.keep_handle(params.handle_id, file)
    }

    /// Keeps `file` open under `handle_id` for `fs/readBlock`.
    fn keep_handle(&self, handle_id: String, file: Located) -> Result<Value, RpcError> {
        let mut handles = self.handles.borrow_mut();
        if handles.len() >= HANDLES_PER_CONNECTION {
            return Err(RpcError::invalid_request(format!(
                "a connection holds at most {HANDLES_PER_CONNECTION} open files: close some first"
            )));
        }
        if handles.contains_key(&handle_id) {
            return Err(RpcError::invalid_request(format!(
                "file handle `{handle_id}` is already open"
            )));
        }
        handles.insert(handle_id.clone(), Rc::new(file));
        Ok(json!({"handleId": handle_id}))
    }

    async fn read_block(&self, params: ReadBlock) -> Result<Value, RpcError> {
        let file = self.handle(&params.handle_id)?;
        if params.len == 0 {
            return Ok(json!({"chunk": "", "eof": false}));
        }
        let length = params.len.min(LARGEST_BLOCK);
        let (data, stat): (Vec<u8>, FileStat) = file
            .directory
            .read_range(&file.name, params.offset, length)
            .await
            .map_err(|error| failed(&error))?;
        let eof = params.offset.saturating_add(data.len() as u64) >= stat.size;
        Ok(json!({"chunk": BASE64.encode(&data), "eof": eof}))
    }

    fn close(&self, params: HandleOnly) -> Result<Value, RpcError> {
        match self.handles.borrow_mut().remove(&params.handle_id) {
            Some(_) => Ok(json!({})),
            None => Err(unknown_handle(&params.handle_id)),
        }
    }

    fn handle(&self, handle_id: &str) -> Result<Rc<Located>, RpcError> {
        self.handles
            .borrow()
            .get(handle_id)
            .cloned()
            .ok_or_else(|| unknown_handle(handle_id))
    }
}

fn unknown_handle(handle_id: &str) -> RpcError {
    RpcError::not_found(format!("unknown file handle `{handle_id}`"))
}

fn not_a_file(path: &Path) -> RpcError {
    RpcError::invalid_request(format!("path `{}` is not a file", path.display()))
}

/// A capexec refusal as Codex's client understands it: a missing path is
/// -32004, a bad parameter -32602, anything else -32603 with the sentence.
fn failed(error: &client::Error) -> RpcError {
    match error.refusal_kind() {
        Some(RefusalKind::NotFound) => RpcError::not_found(error.to_string()),
        Some(RefusalKind::InvalidArgument) => RpcError::invalid_params(error.to_string()),
        _ => RpcError::internal(error.to_string()),
    }
}

/// The absolute, lexically clean path of a `file://` URI.
pub fn absolute(uri_text: &str) -> Result<PathBuf, RpcError> {
    let path = uri::to_path(uri_text)?;
    if !path.is_absolute() {
        return Err(RpcError::invalid_params(format!(
            "`{uri_text}` does not name an absolute path"
        )));
    }
    let mut clean = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::Normal(name) => clean.push(name),
            Component::ParentDir => {
                clean.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Ok(clean)
}

/// `path` relative to `base` (`.` for `base` itself), refused outside it.
fn beneath(base: &Path, path: &Path) -> Result<PathBuf, RpcError> {
    match path.strip_prefix(base) {
        Ok(relative) if relative.as_os_str().is_empty() => Ok(PathBuf::from(".")),
        Ok(relative) => Ok(relative.to_path_buf()),
        Err(_) => Err(RpcError::invalid_params(format!(
            "`{}` is outside `{}`, the directory this bridge serves [capexec:{}]",
            path.display(),
            base.display(),
            RefusalKind::OutsideDirectory.code()
        ))),
    }
}

fn common_ancestor(a: &Path, b: &Path) -> PathBuf {
    let (a, b) = (client::parent_and_name(a).0, client::parent_and_name(b).0);
    let mut common = PathBuf::from("/");
    for (x, y) in a.components().zip(b.components()) {
        if x != y {
            break;
        }
        if let Component::Normal(name) = x {
            common.push(name);
        }
    }
    common
}

fn under_hidden_directory(relative: &Path) -> bool {
    relative
        .parent()
        .into_iter()
        .flat_map(Path::components)
        .any(|component| matches!(component, Component::Normal(name) if name.as_bytes().starts_with(b".")))
}

/// `path` with its final symlinks followed (see [`client::follow_links`]).
async fn followed(executor: &executor::Client, path: &Path) -> Result<PathBuf, RpcError> {
    client::follow_links(executor, path)
        .await
        .map_err(|error| failed(&error))
}

/// Every symlink of `path` resolved, component by component.
async fn canonical(executor: &executor::Client, path: &Path) -> Result<PathBuf, RpcError> {
    let mut resolved = PathBuf::from("/");
    let mut pending: Vec<PathBuf> = path
        .components()
        .rev()
        .filter_map(|component| match component {
            Component::Normal(name) => Some(PathBuf::from(name)),
            Component::ParentDir => Some(PathBuf::from("..")),
            _ => None,
        })
        .collect();
    let mut links = 0;
    while let Some(name) = pending.pop() {
        if name == Path::new("..") {
            resolved.pop();
            continue;
        }
        let directory = Directory::open(executor, &resolved);
        let stat = directory
            .symlink_metadata(&name)
            .await
            .map_err(|error| failed(&error))?;
        if stat.kind != FileKind::Symlink {
            resolved.push(&name);
            continue;
        }
        links += 1;
        if links > MAX_LINKS_FOLLOWED {
            return Err(too_many_links(path));
        }
        let target = PathBuf::from(OsStr::from_bytes(
            &directory
                .read_link(&name)
                .await
                .map_err(|error| failed(&error))?,
        ));
        if target.is_absolute() {
            resolved = PathBuf::from("/");
        }
        pending.extend(
            target
                .components()
                .rev()
                .filter_map(|component| match component {
                    Component::Normal(name) => Some(PathBuf::from(name)),
                    Component::ParentDir => Some(PathBuf::from("..")),
                    _ => None,
                }),
        );
    }
    Ok(resolved)
}

fn too_many_links(path: &Path) -> RpcError {
    RpcError::internal(format!(
        "{}: more than {MAX_LINKS_FOLLOWED} symlinks to follow",
        path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_placed_beneath_their_base() {
        assert_eq!(
            beneath(Path::new("/w"), Path::new("/w")).unwrap(),
            PathBuf::from(".")
        );
        assert_eq!(
            beneath(Path::new("/w"), Path::new("/w/a/b")).unwrap(),
            PathBuf::from("a/b")
        );
        assert!(beneath(Path::new("/w"), Path::new("/wx/a")).is_err());
        assert_eq!(
            absolute("file:///a/./b/../c").unwrap(),
            PathBuf::from("/a/c")
        );
        assert_eq!(absolute("file:///../..").unwrap(), PathBuf::from("/"));
        assert_eq!(
            client::parent_and_name(Path::new("/")),
            (PathBuf::from("/"), PathBuf::from("."))
        );
        assert_eq!(
            common_ancestor(Path::new("/a/b/c"), Path::new("/a/b/d/e")),
            PathBuf::from("/a/b")
        );
        assert_eq!(
            common_ancestor(Path::new("/x/f"), Path::new("/y/g")),
            PathBuf::from("/")
        );
        assert!(under_hidden_directory(Path::new(".git/config")));
        assert!(!under_hidden_directory(Path::new("src/.env")));
    }
}
