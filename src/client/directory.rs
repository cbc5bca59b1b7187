//! A typed `Directory`, in the spirit of `std::fs` and `tokio::fs`: every
//! path is relative to the directory and confined beneath it by the
//! server's kernel. Listings, walks and watches are `Stream`s; uploads
//! read any `AsyncRead`, downloads write any `AsyncWrite`, in bounded
//! chunks with a bounded window on the way.
//!
//! ```
//! use futures::StreamExt;
//! use capexec::client::Directory;
//! use capexec::engine::Engine;
//!
//! let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
//! tokio::task::LocalSet::new().block_on(&runtime, async {
//!     let scratch = std::env::temp_dir().join(format!("capexec-doc-{}", std::process::id()));
//!     std::fs::create_dir_all(&scratch)?;
//!     let executor = capexec::rpc::local_executor(Engine::default());
//!     let dir = Directory::open(&executor, &scratch);
//!     dir.create_dir_all("notes").await?;
//!     dir.write("notes/today", b"hello\n").await?;
//!     assert_eq!(dir.read("notes/today").await?, b"hello\n");
//!     let names: Vec<_> = dir.read_dir("notes").await.map(|e| e.unwrap().path).collect().await;
//!     assert_eq!(names, vec![b"today".to_vec()]);
//!     // Confined: no way out.
//!     assert!(dir.read("../etc/passwd").await.is_err());
//!     dir.remove_dir_all("notes").await?;
//!     std::fs::remove_dir(&scratch)?;
//!     Ok::<_, Box<dyn std::error::Error>>(())
//! })?;
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! ```

use std::collections::VecDeque;
use std::future::Future;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use capnp::traits::HasTypeId;
use futures::Stream;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::capexec_capnp::{
    byte_sink, directory, entry_sink, executor, read_outcome, upload_sink, watch, watch_sink,
    write_outcome,
};
use crate::client::Error;
use crate::model::{
    CopyOptions, DOWNLOAD_CHUNK_BYTES, DirEntry, DirectoryInfo, FileStat, MAX_ONE_SHOT_BYTES,
    Refusal, RefusalKind, SearchOptions, SearchResult, WalkOptions, WalkSummary, WatchEvent,
    WriteOptions,
};
use crate::wire::{self, TRANSFER_WINDOW_BYTES, Window, stream_call};

/// Batches a listing or a download may have buffered between the sink
/// and the consumer: a consumer that stops reading stops acknowledging,
/// which holds the server back.
const BUFFERED_BATCHES: usize = 4;

fn bytes(path: &impl AsRef<Path>) -> &[u8] {
    path.as_ref().as_os_str().as_bytes()
}

/// A call's failure; an `unimplemented` answer means a server from
/// before files, which is said plainly.
fn failure(error: capnp::Error) -> Error {
    if error.kind == capnp::ErrorKind::Unimplemented {
        return Error::Refused(Refusal::new(
            RefusalKind::Unsupported,
            "the server is too old for files (it does not implement Executor.directory)",
        ));
    }
    Error::from(error)
}

/// The answer to `request`, or its failure.
macro_rules! answer {
    ($request:expr) => {
        $request.send().promise.await.map_err(failure)
    };
}

/// A directory on an executor's machine (see the schema's `Directory`).
#[derive(Clone)]
pub struct Directory {
    client: directory::Client,
}

impl Directory {
    /// Directory `path` of `executor`'s machine. Pipelined: it costs no
    /// round trip by itself; a missing directory makes the first call
    /// fail.
    pub fn open(executor: &executor::Client, path: impl AsRef<Path>) -> Directory {
        let mut request = executor.directory_request();
        request.get().set_path(bytes(&path));
        Directory {
            client: request.send().pipeline.get_dir(),
        }
    }

    pub fn from_client(client: directory::Client) -> Directory {
        Directory { client }
    }

    pub fn client(&self) -> &directory::Client {
        &self.client
    }

    /// Directory `path` beneath this one, confined to it. Pipelined.
    pub fn subdirectory(&self, path: impl AsRef<Path>) -> Directory {
        let mut request = self.client.subdirectory_request();
        request.get().set_path(bytes(&path));
        Directory {
            client: request.send().pipeline.get_dir(),
        }
    }

    /// The same directory, read-only (and everything derived from it).
    pub fn read_only(&self) -> Directory {
        Directory {
            client: self.client.read_only_request().send().pipeline.get_dir(),
        }
    }

    /// An executor whose processes run in this directory and may write
    /// only there, with no network (see the schema's
    /// `Directory.executor`). Pipelined: starts on it go out at once.
    pub fn executor(&self) -> executor::Client {
        self.client
            .executor_request()
            .send()
            .pipeline
            .get_executor()
    }

    pub async fn info(&self) -> Result<DirectoryInfo, Error> {
        let response = answer!(self.client.info_request())?;
        Ok(wire::directory_info_from_wire(response.get()?.get_info()?)?)
    }

    async fn stat(&self, path: &[u8], no_follow: bool) -> Result<FileStat, Error> {
        let mut request = self.client.stat_request();
        request.get().set_path(path);
        request.get().set_no_follow(no_follow);
        let response = answer!(request)?;
        Ok(wire::file_stat_from_wire(response.get()?.get_stat()?)?)
    }

    /// What `path` leads to (a final symlink followed, within the directory).
    pub async fn metadata(&self, path: impl AsRef<Path>) -> Result<FileStat, Error> {
        self.stat(bytes(&path), false).await
    }

    /// What `path` is (a final symlink described itself).
    pub async fn symlink_metadata(&self, path: impl AsRef<Path>) -> Result<FileStat, Error> {
        self.stat(bytes(&path), true).await
    }

    /// Whether `path` exists (a dangling symlink does not).
    pub async fn exists(&self, path: impl AsRef<Path>) -> Result<bool, Error> {
        match self.stat(bytes(&path), false).await {
            Ok(_) => Ok(true),
            Err(error) if error.refusal_kind() == Some(RefusalKind::NotFound) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Bytes `offset..offset + length` (`length` 0: to the end; at most
    /// 4 MiB in one call) and the file's stat as it was read.
    pub async fn read_range(
        &self,
        path: impl AsRef<Path>,
        offset: u64,
        length: u64,
    ) -> Result<(Vec<u8>, FileStat), Error> {
        let mut request = self.client.read_file_request();
        request.get().set_path(bytes(&path));
        request.get().set_offset(offset);
        request.get().set_length(length);
        let response = answer!(request)?;
        let response = response.get()?;
        Ok((
            response.get_data()?.to_vec(),
            wire::file_stat_from_wire(response.get_stat()?)?,
        ))
    }

    /// The whole content of file `path`, of any size (one trip up to 8
    /// MiB, a download past that).
    pub async fn read(&self, path: impl AsRef<Path>) -> Result<Vec<u8>, Error> {
        match self.read_range(&path, 0, 0).await {
            Err(error) if error.refusal_kind() == Some(RefusalKind::TooLarge) => {
                let mut content = Vec::new();
                self.download(&path, &mut content).await?;
                Ok(content)
            }
            other => other.map(|(data, _)| data),
        }
    }

    /// Makes `data` the content of file `path`, atomically.
    pub async fn write(
        &self,
        path: impl AsRef<Path>,
        data: impl AsRef<[u8]>,
    ) -> Result<FileStat, Error> {
        self.write_with(path, data, &WriteOptions::default()).await
    }

    /// [`Directory::write`] as `options` say; data of any size (an upload
    /// past 4 MiB).
    pub async fn write_with(
        &self,
        path: impl AsRef<Path>,
        data: impl AsRef<[u8]>,
        options: &WriteOptions,
    ) -> Result<FileStat, Error> {
        let data = data.as_ref();
        if data.len() > MAX_ONE_SHOT_BYTES {
            return self
                .upload(path, data, options, Some(data.len() as u64))
                .await;
        }
        let mut request = self.client.write_file_request();
        request.get().set_path(bytes(&path));
        request.get().set_data(data);
        wire::write_options_to_wire(options, request.get().init_options());
        let response = answer!(request)?;
        Ok(wire::file_stat_from_wire(response.get()?.get_stat()?)?)
    }

    /// Many small files in one call each batch (see the schema's
    /// `writeFiles`: at most [`crate::model::MAX_BATCH_FILES`] files and
    /// [`MAX_ONE_SHOT_BYTES`] in all): each `(path, data, options)` written
    /// as [`Directory::write_with`] would, with an outcome per file, in
    /// order. A server from before `writeFiles` gets one `writeFile` per
    /// file, all pipelined.
    pub async fn write_batch(
        &self,
        files: &[(impl AsRef<Path>, impl AsRef<[u8]>, WriteOptions)],
    ) -> Result<Vec<Result<FileStat, Error>>, Error> {
        let mut request = self.client.write_files_request();
        let mut list = request.get().init_files(files.len() as u32);
        for (index, (path, data, options)) in files.iter().enumerate() {
            let mut item = list.reborrow().get(index as u32);
            item.set_path(bytes(path));
            item.set_data(data.as_ref());
            wire::write_options_to_wire(options, item.init_options());
        }
        let response = match request.send().promise.await {
            Err(error) if error.kind == capnp::ErrorKind::Unimplemented => {
                let writes = files
                    .iter()
                    .map(|(path, data, options)| self.write_with(path, data, options));
                return Ok(futures::future::join_all(writes).await);
            }
            other => other.map_err(failure)?,
        };
        let outcomes = response.get()?.get_outcomes()?;
        one_outcome_each("writeFiles", outcomes.len(), files.len())?;
        outcomes
            .iter()
            .map(|outcome| {
                Ok(match outcome.which()? {
                    write_outcome::Stat(stat) => Ok(wire::file_stat_from_wire(stat?)?),
                    write_outcome::Failure(text) => Err(outcome_failure(text?)?),
                })
            })
            .collect()
    }

    /// Many small files read whole in one call (see the schema's
    /// `readFiles`: at most [`crate::model::MAX_BATCH_FILES`] paths, and
    /// [`MAX_ONE_SHOT_BYTES`] of data in all, past which a file fails alone
    /// as too large): each file's content and stat, or its error, in
    /// order. A server from before `readFiles` gets one pipelined
    /// `readFile` per file.
    pub async fn read_batch(
        &self,
        paths: &[impl AsRef<Path>],
    ) -> Result<Vec<Result<(Vec<u8>, FileStat), Error>>, Error> {
        let mut request = self.client.read_files_request();
        let mut list = request.get().init_paths(paths.len() as u32);
        for (index, path) in paths.iter().enumerate() {
            list.set(index as u32, bytes(path));
        }
        let response = match request.send().promise.await {
            Err(error) if error.kind == capnp::ErrorKind::Unimplemented => {
                let reads = paths.iter().map(|path| self.read_range(path, 0, 0));
                return Ok(futures::future::join_all(reads).await);
            }
            other => other.map_err(failure)?,
        };
        let outcomes = response.get()?.get_outcomes()?;
        one_outcome_each("readFiles", outcomes.len(), paths.len())?;
        outcomes
            .iter()
            .map(|outcome| {
                Ok(match outcome.which()? {
                    read_outcome::File(file) => Ok((
                        file.get_data()?.to_vec(),
                        wire::file_stat_from_wire(file.get_stat()?)?,
                    )),
                    read_outcome::Failure(text) => Err(outcome_failure(text?)?),
                })
            })
            .collect()
    }

    /// Uploads everything `reader` gives as the content of `path`
    /// (committed when the reader ends; nothing visible before, and
    /// nothing left behind if anything fails). `size`, when known, is
    /// checked by the server.
    pub async fn upload(
        &self,
        path: impl AsRef<Path>,
        mut reader: impl AsyncRead + Unpin,
        options: &WriteOptions,
        size: Option<u64>,
    ) -> Result<FileStat, Error> {
        let mut request = self.client.upload_request();
        request.get().set_path(bytes(&path));
        wire::write_options_to_wire(options, request.get().init_options());
        request.get().set_size(size.unwrap_or(0));
        request.get().set_size_known(size.is_some());
        let call = request.send();
        let sink = call.pipeline.get_sink();
        let pushed = push_all(&sink, &mut reader).await;
        let opened = call.promise.await.map_err(failure);
        // The upload's own refusal says more than a write's echo of it.
        opened?;
        pushed?;
        let response = answer!(sink.done_request())?;
        Ok(wire::file_stat_from_wire(response.get()?.get_stat()?)?)
    }

    /// Writes the content of file `path` into `writer`; answers the number
    /// of bytes and the file's stat as it was opened.
    pub async fn download(
        &self,
        path: impl AsRef<Path>,
        writer: impl AsyncWrite + Unpin,
    ) -> Result<(u64, FileStat), Error> {
        self.download_range(path, 0, 0, writer).await
    }

    /// Bytes `offset..offset + length` (`length` 0: to the end) of `path`
    /// into `writer`.
    pub async fn download_range(
        &self,
        path: impl AsRef<Path>,
        offset: u64,
        length: u64,
        mut writer: impl AsyncWrite + Unpin,
    ) -> Result<(u64, FileStat), Error> {
        let (chunks, mut received) = mpsc::channel(BUFFERED_BATCHES);
        let mut request = self.client.download_request();
        request.get().set_path(bytes(&path));
        request.get().set_offset(offset);
        request.get().set_length(length);
        request
            .get()
            .set_sink(capnp_rpc::new_client(ByteSinkImpl { chunks }));
        let mut promise = request.send().promise;
        let mut written = 0u64;
        let response = loop {
            tokio::select! {
                biased;
                Some(chunk) = received.recv() => {
                    let data = chunk.get()?.get_data()?;
                    write_chunk(&mut writer, data).await?;
                    written += data.len() as u64;
                }
                response = &mut promise => break response.map_err(failure)?,
            }
        };
        // Every chunk was acknowledged before the answer: what is left is
        // here already.
        while let Ok(chunk) = received.try_recv() {
            let data = chunk.get()?.get_data()?;
            write_chunk(&mut writer, data).await?;
            written += data.len() as u64;
        }
        writer.flush().await.map_err(local_io)?;
        let response = response.get()?;
        let size = response.get_size();
        if size != written {
            return Err(Error::Rpc(capnp::Error::failed(format!(
                "the download announced {size} bytes and delivered {written}"
            ))));
        }
        Ok((size, wire::file_stat_from_wire(response.get_stat()?)?))
    }

    /// The entries of directory `path`, as the server pushes them.
    pub async fn read_dir(&self, path: impl AsRef<Path>) -> EntryStream {
        let (sink, batches) = entry_sink();
        let mut request = self.client.list_request();
        request.get().set_path(bytes(&path));
        request.get().set_sink(sink);
        let promise = request.send().promise;
        EntryStream::new(
            batches,
            Box::pin(async move {
                let response = promise.await.map_err(failure)?;
                Ok(WalkSummary {
                    entries: response.get()?.get_entries(),
                    truncated: false,
                })
            }),
        )
    }

    /// Every entry beneath directory `path`, depth first.
    pub async fn walk(&self, path: impl AsRef<Path>, options: &WalkOptions) -> EntryStream {
        let (sink, batches) = entry_sink();
        let mut request = self.client.walk_request();
        request.get().set_path(bytes(&path));
        wire::walk_options_to_wire(options, request.get().init_options());
        request.get().set_sink(sink);
        let promise = request.send().promise;
        EntryStream::new(
            batches,
            Box::pin(async move {
                let response = promise.await.map_err(failure)?;
                let response = response.get()?;
                Ok(WalkSummary {
                    entries: response.get_entries(),
                    truncated: response.get_truncated(),
                })
            }),
        )
    }

    /// Lines matching a regular expression in the files beneath directory
    /// `path`, searched on the server (see the schema's `search`). A
    /// server from before it refuses with `[capexec:unsupported]`.
    pub async fn search(
        &self,
        path: impl AsRef<Path>,
        options: &SearchOptions,
    ) -> Result<SearchResult, Error> {
        let mut request = self.client.search_request();
        request.get().set_path(bytes(&path));
        wire::search_options_to_wire(options, request.get().init_options());
        let response = match request.send().promise.await {
            Err(error) if error.kind == capnp::ErrorKind::Unimplemented => {
                return Err(Error::Refused(Refusal::new(
                    RefusalKind::Unsupported,
                    "the server is too old to search files (it does not implement \
                     Directory.search)",
                )));
            }
            other => other.map_err(failure)?,
        };
        Ok(wire::search_result_from_wire(
            response.get()?.get_result()?,
        )?)
    }

    async fn mkdir(&self, path: &[u8], recursive: bool, mode: u32) -> Result<(), Error> {
        let mut request = self.client.mkdir_request();
        request.get().set_path(path);
        request.get().set_recursive(recursive);
        request.get().set_mode(mode);
        answer!(request).map(drop)
    }

    pub async fn create_dir(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        self.mkdir(bytes(&path), false, 0o777).await
    }

    pub async fn create_dir_all(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        self.mkdir(bytes(&path), true, 0o777).await
    }

    /// Creates directory `path` with permission bits `mode` (less the
    /// server's umask), and with `recursive` its parents.
    pub async fn create_dir_with(
        &self,
        path: impl AsRef<Path>,
        recursive: bool,
        mode: u32,
    ) -> Result<(), Error> {
        self.mkdir(bytes(&path), recursive, mode).await
    }

    /// Removes `path` (see the schema's `remove`); how many entries went.
    pub async fn remove(
        &self,
        path: impl AsRef<Path>,
        recursive: bool,
        missing_ok: bool,
    ) -> Result<u64, Error> {
        let mut request = self.client.remove_request();
        request.get().set_path(bytes(&path));
        request.get().set_recursive(recursive);
        request.get().set_missing_ok(missing_ok);
        Ok(answer!(request)?.get()?.get_removed())
    }

    /// A file, a symlink or an empty directory.
    pub async fn remove_file(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        self.remove(path, false, false).await.map(drop)
    }

    pub async fn remove_dir_all(&self, path: impl AsRef<Path>) -> Result<u64, Error> {
        self.remove(path, true, false).await
    }

    pub async fn rename(
        &self,
        from: impl AsRef<Path>,
        to: impl AsRef<Path>,
        no_replace: bool,
    ) -> Result<(), Error> {
        let mut request = self.client.rename_request();
        request.get().set_from(bytes(&from));
        request.get().set_to(bytes(&to));
        request.get().set_no_replace(no_replace);
        answer!(request).map(drop)
    }

    /// Copies on the server (no data crosses the connection).
    pub async fn copy(
        &self,
        from: impl AsRef<Path>,
        to: impl AsRef<Path>,
        options: &CopyOptions,
    ) -> Result<u64, Error> {
        let mut request = self.client.copy_request();
        request.get().set_from(bytes(&from));
        request.get().set_to(bytes(&to));
        wire::copy_options_to_wire(options, request.get().init_options());
        Ok(answer!(request)?.get()?.get_copied())
    }

    pub async fn symlink(
        &self,
        target: impl AsRef<Path>,
        path: impl AsRef<Path>,
    ) -> Result<(), Error> {
        let mut request = self.client.symlink_request();
        request.get().set_target(bytes(&target));
        request.get().set_path(bytes(&path));
        answer!(request).map(drop)
    }

    pub async fn read_link(&self, path: impl AsRef<Path>) -> Result<Vec<u8>, Error> {
        let mut request = self.client.readlink_request();
        request.get().set_path(bytes(&path));
        Ok(answer!(request)?.get()?.get_target()?.to_vec())
    }

    pub async fn set_permissions(&self, path: impl AsRef<Path>, mode: u32) -> Result<(), Error> {
        let mut request = self.client.set_permissions_request();
        request.get().set_path(bytes(&path));
        request.get().set_mode(mode);
        answer!(request).map(drop)
    }

    /// Access and modification times, ns since the Unix epoch.
    pub async fn set_times(
        &self,
        path: impl AsRef<Path>,
        accessed_ns: i64,
        modified_ns: i64,
    ) -> Result<(), Error> {
        let mut request = self.client.set_times_request();
        request.get().set_path(bytes(&path));
        request.get().set_accessed_ns(accessed_ns);
        request.get().set_modified_ns(modified_ns);
        answer!(request).map(drop)
    }

    /// `path` resolved, relative to this directory.
    pub async fn canonicalize(&self, path: impl AsRef<Path>) -> Result<Vec<u8>, Error> {
        let mut request = self.client.canonicalize_request();
        request.get().set_path(bytes(&path));
        Ok(answer!(request)?.get()?.get_path()?.to_vec())
    }

    /// Changes beneath directory `path`, from when this answers on.
    pub async fn watch(
        &self,
        path: impl AsRef<Path>,
        recursive: bool,
    ) -> Result<WatchStream, Error> {
        let (events, received) = mpsc::channel(BUFFERED_BATCHES);
        let mut request = self.client.watch_request();
        request.get().set_path(bytes(&path));
        request.get().init_options().set_recursive(recursive);
        request
            .get()
            .set_sink(capnp_rpc::new_client(WatchSinkImpl { events }));
        let response = answer!(request)?;
        Ok(WatchStream {
            events: received,
            pending: VecDeque::new(),
            _watch: response.get()?.get_watch()?,
        })
    }
}

/// A batch's answer has an outcome for each file it carried.
fn one_outcome_each(method: &str, outcomes: u32, files: usize) -> Result<(), Error> {
    if outcomes as usize == files {
        return Ok(());
    }
    Err(Error::Rpc(capnp::Error::failed(format!(
        "{method} answered {outcomes} outcomes for {files} files"
    ))))
}

/// The error of one file of a batch, as its own call would have failed.
fn outcome_failure(text: capnp::text::Reader<'_>) -> capnp::Result<Error> {
    let text = text
        .to_str()
        .map_err(|error| capnp::Error::failed(format!("a malformed outcome: {error}")))?;
    Ok(match Refusal::from_description(text) {
        Some(refusal) => Error::Refused(refusal),
        None => Error::Rpc(capnp::Error::failed(text.to_string())),
    })
}

fn local_io(error: std::io::Error) -> Error {
    Error::Refused(Refusal::new(
        RefusalKind::Internal,
        format!(
            "writing the download locally: {}",
            crate::model::io_message(&error)
        ),
    ))
}

async fn write_chunk(writer: &mut (impl AsyncWrite + Unpin), chunk: &[u8]) -> Result<(), Error> {
    writer.write_all(chunk).await.map_err(local_io)
}

/// Reads `reader` to its end in chunks and writes them to `sink`, read
/// into one buffer that is copied once, into the message. (1 MiB writes
/// with 4 MiB in flight measured slower than 256 KiB with 1 MiB: each
/// message of 1 MiB is a fresh mapping the kernel zeroes.)
async fn push_all(
    sink: &upload_sink::Client,
    reader: &mut (impl AsyncRead + Unpin),
) -> Result<(), Error> {
    let mut window = Window::new(TRANSFER_WINDOW_BYTES);
    loop {
        // Read straight into the message that carries the chunk: a copy
        // less per byte (the upload's client is on its critical path).
        let mut request = write_call(sink, DOWNLOAD_CHUNK_BYTES);
        let mut params = request.get();
        let chunk = params.reborrow().init_data(DOWNLOAD_CHUNK_BYTES as u32);
        let filled = fill(reader, chunk).await?;
        if filled == 0 {
            return window.drain().await.map_err(failure);
        }
        let request = if filled == DOWNLOAD_CHUNK_BYTES {
            request
        } else {
            // The last, short chunk: a Data's length is fixed once made.
            let mut short = write_call(sink, filled);
            short.get().set_data(&params.get_data()?[..filled]);
            short
        };
        window
            .send(request.send().promise, filled)
            .await
            .map_err(failure)?;
    }
}

/// An `UploadSink.write` sized for `bytes` of data.
fn write_call(
    sink: &upload_sink::Client,
    bytes: usize,
) -> capnp::capability::Request<upload_sink::write_params::Owned, capnp::any_pointer::Owned> {
    let size = capnp::MessageSize {
        word_count: (bytes / 8 + 8) as u64,
        cap_count: 0,
    };
    stream_call::<upload_sink::write_params::Owned>(
        &sink.client,
        upload_sink::Client::TYPE_ID,
        0,
        size,
    )
}

/// Reads from `reader` until `chunk` is full or the input ends; answers
/// how much was read.
async fn fill(reader: &mut (impl AsyncRead + Unpin), chunk: &mut [u8]) -> Result<usize, Error> {
    let mut filled = 0;
    while filled < chunk.len() {
        match reader.read(&mut chunk[filled..]).await {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => {
                return Err(Error::Refused(Refusal::new(
                    RefusalKind::Internal,
                    format!(
                        "reading what to upload: {} (nothing was written)",
                        crate::model::io_message(&error)
                    ),
                )));
            }
        }
    }
    Ok(filled)
}

/// A download's chunks are passed on as the calls' parameters, and
/// written from the messages they came in: copying each 256 KiB out first
/// was the client's largest cost.
struct ByteSinkImpl {
    chunks: mpsc::Sender<byte_sink::WriteParams>,
}

impl byte_sink::Server for ByteSinkImpl {
    async fn write(self: Rc<Self>, params: byte_sink::WriteParams) -> Result<(), capnp::Error> {
        // A malformed chunk fails its own call, not the download's reader.
        params.get()?.get_data()?;
        self.chunks
            .send(params)
            .await
            .map_err(|_| capnp::Error::failed("the download's receiver went away".into()))
    }
}

struct EntrySinkImpl {
    batches: mpsc::Sender<Vec<DirEntry>>,
}

impl entry_sink::Server for EntrySinkImpl {
    async fn push(self: Rc<Self>, params: entry_sink::PushParams) -> Result<(), capnp::Error> {
        let entries = wire::dir_entries_from_wire(params.get()?.get_entries()?)?;
        self.batches
            .send(entries)
            .await
            .map_err(|_| capnp::Error::failed("the listing was dropped".into()))
    }
}

fn entry_sink() -> (entry_sink::Client, mpsc::Receiver<Vec<DirEntry>>) {
    let (batches, received) = mpsc::channel(BUFFERED_BATCHES);
    (capnp_rpc::new_client(EntrySinkImpl { batches }), received)
}

type Summary = Pin<Box<dyn Future<Output = Result<WalkSummary, Error>>>>;

/// The entries of a listing or a walk. It ends after the last entry, or
/// with the call's error; [`EntryStream::summary`] then tells how many
/// entries there were and whether the walk was truncated. Dropping it
/// stops the listing.
pub struct EntryStream {
    batches: mpsc::Receiver<Vec<DirEntry>>,
    pending: VecDeque<DirEntry>,
    answer: Option<Summary>,
    summary: Option<WalkSummary>,
    ended: bool,
}

impl EntryStream {
    fn new(batches: mpsc::Receiver<Vec<DirEntry>>, answer: Summary) -> EntryStream {
        EntryStream {
            batches,
            pending: VecDeque::new(),
            answer: Some(answer),
            summary: None,
            ended: false,
        }
    }

    /// What the server answered, once the stream has ended without error.
    pub fn summary(&self) -> Option<WalkSummary> {
        self.summary
    }

    /// Every entry, or the first error.
    pub async fn collect_all(mut self) -> Result<Vec<DirEntry>, Error> {
        use futures::StreamExt;
        let mut entries = Vec::new();
        while let Some(entry) = self.next().await {
            entries.push(entry?);
        }
        Ok(entries)
    }
}

impl Stream for EntryStream {
    type Item = Result<DirEntry, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(entry) = this.pending.pop_front() {
                return Poll::Ready(Some(Ok(entry)));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            let Some(answer) = this.answer.as_mut() else {
                // Answered: every batch was acknowledged, so it is here.
                match this.batches.try_recv() {
                    Ok(batch) => this.pending.extend(batch),
                    Err(_) => this.ended = true,
                }
                continue;
            };
            if let Poll::Ready(Some(batch)) = this.batches.poll_recv(cx) {
                this.pending.extend(batch);
                continue;
            }
            match answer.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(summary)) => {
                    this.summary = Some(summary);
                    this.answer = None;
                }
                Poll::Ready(Err(error)) => {
                    this.answer = None;
                    this.ended = true;
                    this.pending.clear();
                    return Poll::Ready(Some(Err(error)));
                }
            }
        }
    }
}

struct WatchSinkImpl {
    events: mpsc::Sender<Vec<WatchEvent>>,
}

impl watch_sink::Server for WatchSinkImpl {
    async fn push(self: Rc<Self>, params: watch_sink::PushParams) -> Result<(), capnp::Error> {
        let events = wire::watch_events_from_wire(params.get()?.get_events()?)?;
        self.events
            .send(events)
            .await
            .map_err(|_| capnp::Error::failed("the watch was dropped".into()))
    }
}

/// Changes as the server reports them, coalesced. It ends when the
/// watched directory is gone (after a `gone` event) or the connection
/// breaks; dropping it ends the watch.
pub struct WatchStream {
    events: mpsc::Receiver<Vec<WatchEvent>>,
    pending: VecDeque<WatchEvent>,
    _watch: watch::Client,
}

impl WatchStream {
    /// The next batch as the server pushed it.
    pub async fn next_batch(&mut self) -> Option<Vec<WatchEvent>> {
        if !self.pending.is_empty() {
            return Some(self.pending.drain(..).collect());
        }
        self.events.recv().await
    }
}

impl Stream for WatchStream {
    type Item = WatchEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Poll::Ready(Some(event));
            }
            match self.events.poll_recv(cx) {
                Poll::Ready(Some(batch)) => self.pending.extend(batch),
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_from_before_files_is_said_to_be_too_old() {
        let error = failure(capnp::Error::unimplemented(
            "Method not implemented.".to_string(),
        ));
        assert_eq!(error.refusal_kind(), Some(RefusalKind::Unsupported));
        assert_eq!(
            error.to_string(),
            "the server is too old for files (it does not implement Executor.directory)"
        );
    }
}
