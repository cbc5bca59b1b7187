//! `Directory`: the file engine (`crate::files`) as a capability, with the
//! sinks of its streams. Listings, walks and downloads push into the
//! client's sink with at most [`wire::TRANSFER_WINDOW_BYTES`]
//! unacknowledged, answering once everything arrived; uploads hand out a
//! sink of their own; a watch delivers until its `Watch` is released.

use std::rc::Rc;

use capnp::traits::HasTypeId;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use crate::capexec_capnp::{byte_sink, directory, entry_sink, upload_sink, watch, watch_sink};
use crate::files::{self, Upload, Watcher};
use crate::model::{DirEntry, ENTRY_BATCH, Refusal};
use crate::rpc::executor::Origin;
use crate::rpc::file_limits::{DescriptorHold, FileLimits, FileTicket};
use crate::wire::{self, TRANSFER_WINDOW_BYTES, Window, stream_call};

/// The features `Directory` implements (see `ExecutorInfo.features`).
pub(crate) const DIRECTORY_FEATURES: &[&str] = &[
    "files",
    "file-watch",
    "directory-executor",
    "file-batches",
    "file-search",
];

/// Unacknowledged bytes of watch events on the way to a client: past
/// this, events wait on the server, and past their limit an `overflow`
/// tells the client it lost some.
const WATCH_WINDOW_BYTES: usize = 64 * 1024;

pub struct DirectoryImpl {
    dir: files::Directory,
    limits: FileLimits,
    /// The executor it came from, for `executor`.
    origin: Rc<Origin>,
    /// Its descriptor, counted against the connection and the server.
    _hold: DescriptorHold,
}

impl DirectoryImpl {
    /// `hold` is taken before the directory is opened, so that a peer at
    /// its limit costs the server no descriptor, not even for a moment.
    pub(crate) fn new(
        dir: files::Directory,
        limits: FileLimits,
        origin: Rc<Origin>,
        hold: DescriptorHold,
    ) -> Self {
        DirectoryImpl {
            dir,
            limits,
            origin,
            _hold: hold,
        }
    }

    fn derived(&self, dir: files::Directory, hold: DescriptorHold) -> directory::Client {
        capnp_rpc::new_client(DirectoryImpl::new(
            dir,
            self.limits.clone(),
            Rc::clone(&self.origin),
            hold,
        ))
    }
}

/// Pushes the batches of a listing or walk into `sink`.
async fn pump_entries(
    sink: entry_sink::Client,
    mut batches: mpsc::Receiver<Vec<DirEntry>>,
) -> Result<(), capnp::Error> {
    let mut window = Window::new(TRANSFER_WINDOW_BYTES);
    while let Some(batch) = batches.recv().await {
        let size = wire::dir_entries_message_size(&batch);
        let mut request = stream_call::<entry_sink::push_params::Owned>(
            &sink.client,
            entry_sink::Client::TYPE_ID,
            0,
            size,
        );
        wire::dir_entries_to_wire(&batch, request.get().init_entries(batch.len() as u32));
        window
            .send(request.send().promise, size.word_count as usize * 8)
            .await?;
    }
    window.drain().await
}

fn data_path(path: capnp::Result<capnp::data::Reader<'_>>) -> capnp::Result<Vec<u8>> {
    Ok(path?.to_vec())
}

impl directory::Server for DirectoryImpl {
    async fn stat(
        self: Rc<Self>,
        params: directory::StatParams,
        mut results: directory::StatResults,
    ) -> Result<(), capnp::Error> {
        let params = params.get()?;
        let stat = self
            .dir
            .stat(data_path(params.get_path())?, params.get_no_follow())
            .await?;
        wire::file_stat_to_wire(&stat, results.get().init_stat());
        Ok(())
    }

    async fn list(
        self: Rc<Self>,
        params: directory::ListParams,
        mut results: directory::ListResults,
    ) -> Result<(), capnp::Error> {
        let params = params.get()?;
        let path = data_path(params.get_path())?;
        let sink = params.get_sink()?;
        let _ticket = self.limits.transfer()?;
        let (batches, received) = mpsc::channel(2);
        let (listed, pumped) =
            futures::join!(self.dir.list(path, batches), pump_entries(sink, received));
        pumped?;
        results.get().set_entries(listed?);
        Ok(())
    }

    async fn walk(
        self: Rc<Self>,
        params: directory::WalkParams,
        mut results: directory::WalkResults,
    ) -> Result<(), capnp::Error> {
        let params = params.get()?;
        let path = data_path(params.get_path())?;
        let options = wire::walk_options_from_wire(params.get_options()?)?;
        let sink = params.get_sink()?;
        let _ticket = self.limits.transfer()?;
        let (batches, received) = mpsc::channel(2);
        // The transfer counts the walked directory; each level the walk
        // enters holds one more.
        let mut deeper = None;
        let levels = |open: usize| {
            deeper = None;
            if open > 1 {
                deeper = Some(self.limits.descriptors(open - 1, "levels of walks")?);
            }
            Ok(())
        };
        let (walked, pumped) = futures::join!(
            self.dir.walk(path, options, batches, levels),
            pump_entries(sink, received)
        );
        pumped?;
        let summary = walked?;
        let mut results = results.get();
        results.set_entries(summary.entries);
        results.set_truncated(summary.truncated);
        Ok(())
    }

    async fn search(
        self: Rc<Self>,
        params: directory::SearchParams,
        mut results: directory::SearchResults,
    ) -> Result<(), capnp::Error> {
        let params = params.get()?;
        let path = data_path(params.get_path())?;
        let options = wire::search_options_from_wire(params.get_options()?)?;
        let _ticket = self.limits.transfer()?;
        // As a walk: the transfer counts the searched directory, each
        // level entered one more.
        let mut deeper = None;
        let levels = |open: usize| {
            deeper = None;
            if open > 1 {
                deeper = Some(self.limits.descriptors(open - 1, "levels of searches")?);
            }
            Ok(())
        };
        let found = self.dir.search(path, options, levels).await?;
        wire::search_result_to_wire(&found, results.get().init_result());
        Ok(())
    }

    async fn read_file(
        self: Rc<Self>,
        params: directory::ReadFileParams,
        mut results: directory::ReadFileResults,
    ) -> Result<(), capnp::Error> {
        let params = params.get()?;
        let (data, stat) = self
            .dir
            .read_file(
                data_path(params.get_path())?,
                params.get_offset(),
                params.get_length(),
            )
            .await?;
        let mut results = results.get();
        results.set_data(&data);
        wire::file_stat_to_wire(&stat, results.init_stat());
        Ok(())
    }

    async fn write_file(
        self: Rc<Self>,
        params: directory::WriteFileParams,
        mut results: directory::WriteFileResults,
    ) -> Result<(), capnp::Error> {
        let params = params.get()?;
        let options = wire::write_options_from_wire(params.get_options()?)?;
        let stat = self
            .dir
            .write_file(
                data_path(params.get_path())?,
                params.get_data()?.to_vec(),
                options,
            )
            .await?;
        wire::file_stat_to_wire(&stat, results.get().init_stat());
        Ok(())
    }

    async fn write_files(
        self: Rc<Self>,
        params: directory::WriteFilesParams,
        mut results: directory::WriteFilesResults,
    ) -> Result<(), capnp::Error> {
        let list = params.get()?.get_files()?;
        // Checked before anything is copied out of the message: a list of
        // empty structs costs its sender a word per element.
        let mut bytes = 0usize;
        for file in list.iter() {
            bytes = bytes.saturating_add(file.get_data()?.len());
        }
        files::check_batch("writeFiles", list.len() as usize, bytes)?;
        let mut files = Vec::with_capacity(list.len() as usize);
        for file in list.iter() {
            files.push((
                data_path(file.get_path())?,
                file.get_data()?.to_vec(),
                wire::write_options_from_wire(file.get_options()?)?,
            ));
        }
        let outcomes = self.dir.write_files(files).await?;
        let mut list = results.get().init_outcomes(outcomes.len() as u32);
        for (index, outcome) in outcomes.iter().enumerate() {
            let mut item = list.reborrow().get(index as u32);
            match outcome {
                Ok(stat) => wire::file_stat_to_wire(stat, item.init_stat()),
                Err(refusal) => item.set_failure(refusal.to_string().as_str()),
            }
        }
        Ok(())
    }

    async fn read_files(
        self: Rc<Self>,
        params: directory::ReadFilesParams,
        mut results: directory::ReadFilesResults,
    ) -> Result<(), capnp::Error> {
        let list = params.get()?.get_paths()?;
        files::check_batch("readFiles", list.len() as usize, 0)?;
        let mut paths = Vec::with_capacity(list.len() as usize);
        for path in list.iter() {
            paths.push(data_path(path)?);
        }
        let outcomes = self.dir.read_files(paths).await?;
        let mut list = results.get().init_outcomes(outcomes.len() as u32);
        for (index, outcome) in outcomes.iter().enumerate() {
            let mut item = list.reborrow().get(index as u32);
            match outcome {
                Ok((data, stat)) => {
                    let mut file = item.init_file();
                    file.set_data(data);
                    wire::file_stat_to_wire(stat, file.init_stat());
                }
                Err(refusal) => item.set_failure(refusal.to_string().as_str()),
            }
        }
        Ok(())
    }

    async fn upload(
        self: Rc<Self>,
        params: directory::UploadParams,
        mut results: directory::UploadResults,
    ) -> Result<(), capnp::Error> {
        let params = params.get()?;
        let options = wire::write_options_from_wire(params.get_options()?)?;
        let size = params.get_size_known().then(|| params.get_size());
        let ticket = self.limits.transfer()?;
        let upload = self
            .dir
            .upload(data_path(params.get_path())?, options, size)
            .await?;
        results
            .get()
            .set_sink(capnp_rpc::new_client(UploadSinkImpl {
                upload: tokio::sync::Mutex::new(upload),
                ticket: std::cell::RefCell::new(Some(ticket)),
            }));
        Ok(())
    }

    async fn download(
        self: Rc<Self>,
        params: directory::DownloadParams,
        mut results: directory::DownloadResults,
    ) -> Result<(), capnp::Error> {
        let params = params.get()?;
        let sink = params.get_sink()?;
        let _ticket = self.limits.transfer()?;
        let mut download = self
            .dir
            .download(
                data_path(params.get_path())?,
                params.get_offset(),
                params.get_length(),
            )
            .await?;
        let mut window = Window::new(TRANSFER_WINDOW_BYTES);
        while let Some(chunk) = download.chunks.recv().await {
            let chunk = chunk?;
            let size = capnp::MessageSize {
                word_count: (chunk.len() / 8 + 8) as u64,
                cap_count: 0,
            };
            let mut request = stream_call::<byte_sink::write_params::Owned>(
                &sink.client,
                byte_sink::Client::TYPE_ID,
                0,
                size,
            );
            request.get().set_data(&chunk);
            window.send(request.send().promise, chunk.len()).await?;
        }
        window.drain().await?;
        let mut results = results.get();
        results.set_size(download.size);
        wire::file_stat_to_wire(&download.stat, results.init_stat());
        Ok(())
    }

    async fn mkdir(
        self: Rc<Self>,
        params: directory::MkdirParams,
        _: directory::MkdirResults,
    ) -> Result<(), capnp::Error> {
        let params = params.get()?;
        self.dir
            .mkdir(
                data_path(params.get_path())?,
                params.get_recursive(),
                params.get_mode(),
            )
            .await?;
        Ok(())
    }

    async fn remove(
        self: Rc<Self>,
        params: directory::RemoveParams,
        mut results: directory::RemoveResults,
    ) -> Result<(), capnp::Error> {
        let params = params.get()?;
        let removed = self
            .dir
            .remove(
                data_path(params.get_path())?,
                params.get_recursive(),
                params.get_missing_ok(),
            )
            .await?;
        results.get().set_removed(removed);
        Ok(())
    }

    async fn rename(
        self: Rc<Self>,
        params: directory::RenameParams,
        _: directory::RenameResults,
    ) -> Result<(), capnp::Error> {
        let params = params.get()?;
        self.dir
            .rename(
                data_path(params.get_from())?,
                data_path(params.get_to())?,
                params.get_no_replace(),
            )
            .await?;
        Ok(())
    }

    async fn copy(
        self: Rc<Self>,
        params: directory::CopyParams,
        mut results: directory::CopyResults,
    ) -> Result<(), capnp::Error> {
        let params = params.get()?;
        let copied = self
            .dir
            .copy(
                data_path(params.get_from())?,
                data_path(params.get_to())?,
                wire::copy_options_from_wire(params.get_options()?),
            )
            .await?;
        results.get().set_copied(copied);
        Ok(())
    }

    async fn symlink(
        self: Rc<Self>,
        params: directory::SymlinkParams,
        _: directory::SymlinkResults,
    ) -> Result<(), capnp::Error> {
        let params = params.get()?;
        self.dir
            .symlink(
                data_path(params.get_target())?,
                data_path(params.get_path())?,
            )
            .await?;
        Ok(())
    }

    async fn readlink(
        self: Rc<Self>,
        params: directory::ReadlinkParams,
        mut results: directory::ReadlinkResults,
    ) -> Result<(), capnp::Error> {
        let target = self
            .dir
            .readlink(data_path(params.get()?.get_path())?)
            .await?;
        results.get().set_target(&target);
        Ok(())
    }

    async fn set_permissions(
        self: Rc<Self>,
        params: directory::SetPermissionsParams,
        _: directory::SetPermissionsResults,
    ) -> Result<(), capnp::Error> {
        let params = params.get()?;
        self.dir
            .set_permissions(data_path(params.get_path())?, params.get_mode())
            .await?;
        Ok(())
    }

    async fn set_times(
        self: Rc<Self>,
        params: directory::SetTimesParams,
        _: directory::SetTimesResults,
    ) -> Result<(), capnp::Error> {
        let params = params.get()?;
        self.dir
            .set_times(
                data_path(params.get_path())?,
                params.get_accessed_ns(),
                params.get_modified_ns(),
            )
            .await?;
        Ok(())
    }

    async fn canonicalize(
        self: Rc<Self>,
        params: directory::CanonicalizeParams,
        mut results: directory::CanonicalizeResults,
    ) -> Result<(), capnp::Error> {
        let path = self
            .dir
            .canonicalize(data_path(params.get()?.get_path())?)
            .await?;
        results.get().set_path(&path);
        Ok(())
    }

    async fn subdirectory(
        self: Rc<Self>,
        params: directory::SubdirectoryParams,
        mut results: directory::SubdirectoryResults,
    ) -> Result<(), capnp::Error> {
        let hold = self.limits.directory()?;
        let dir = self
            .dir
            .subdirectory(data_path(params.get()?.get_path())?)
            .await?;
        results.get().set_dir(self.derived(dir, hold));
        Ok(())
    }

    async fn read_only(
        self: Rc<Self>,
        _: directory::ReadOnlyParams,
        mut results: directory::ReadOnlyResults,
    ) -> Result<(), capnp::Error> {
        let hold = self.limits.directory()?;
        results
            .get()
            .set_dir(self.derived(self.dir.read_only(), hold));
        Ok(())
    }

    async fn executor(
        self: Rc<Self>,
        _: directory::ExecutorParams,
        mut results: directory::ExecutorResults,
    ) -> Result<(), capnp::Error> {
        let info = self.dir.info().await?;
        let executor = self.origin.confined_to(&info)?;
        results.get().set_executor(executor);
        Ok(())
    }

    async fn watch(
        self: Rc<Self>,
        params: directory::WatchParams,
        mut results: directory::WatchResults,
    ) -> Result<(), capnp::Error> {
        let params = params.get()?;
        let recursive = params.get_options()?.get_recursive();
        let sink = params.get_sink()?;
        let ticket = self.limits.watch()?;
        let watcher = self
            .dir
            .watch(data_path(params.get_path())?, recursive)
            .await?;
        let delivery = tokio::task::spawn_local(deliver_events(watcher, sink));
        results.get().set_watch(capnp_rpc::new_client(WatchImpl {
            delivery: delivery.abort_handle(),
            _ticket: ticket,
        }));
        Ok(())
    }

    async fn info(
        self: Rc<Self>,
        _: directory::InfoParams,
        mut results: directory::InfoResults,
    ) -> Result<(), capnp::Error> {
        let info = self.dir.info().await?;
        wire::directory_info_to_wire(&info, results.get().init_info());
        Ok(())
    }
}

/// The sink of an upload: writes in order (the method is `-> stream`,
/// and the lock is fair besides), then `done`.
struct UploadSinkImpl {
    upload: tokio::sync::Mutex<Upload>,
    /// Its place among the connection's transfers: given back once the
    /// upload is over (done, or failed), not only when the sink goes.
    ticket: std::cell::RefCell<Option<FileTicket>>,
}

impl UploadSinkImpl {
    fn over(&self) {
        self.ticket.borrow_mut().take();
    }
}

impl upload_sink::Server for UploadSinkImpl {
    async fn write(self: Rc<Self>, params: upload_sink::WriteParams) -> Result<(), capnp::Error> {
        // Shared with the message it came in rather than copied: the call
        // holds that message until the chunk is queued anyway, and at most
        // two chunks of an upload wait (`files::Upload`).
        let data = wire::received::bytes_of(
            params.get()?.get_data()?,
            wire::received::COUNTED_HELD_PER_BYTE,
        );
        let mut upload = self.upload.lock().await;
        upload.write(data).await.inspect_err(|_| self.over())?;
        Ok(())
    }

    async fn done(
        self: Rc<Self>,
        _: upload_sink::DoneParams,
        mut results: upload_sink::DoneResults,
    ) -> Result<(), capnp::Error> {
        let outcome = self.upload.lock().await.commit().await;
        self.over();
        wire::file_stat_to_wire(&outcome?, results.get().init_stat());
        Ok(())
    }
}

/// A watch; releasing it ends the delivery (and the watch thread).
struct WatchImpl {
    delivery: AbortHandle,
    _ticket: FileTicket,
}

impl Drop for WatchImpl {
    fn drop(&mut self) {
        self.delivery.abort();
    }
}

impl watch::Server for WatchImpl {}

async fn deliver_events(watcher: Watcher, sink: watch_sink::Client) {
    let mut window = Window::new(WATCH_WINDOW_BYTES);
    while let Some(events) = watcher.next(ENTRY_BATCH).await {
        let size = capnp::MessageSize {
            word_count: events
                .iter()
                .map(|event| (event.path.len() + event.to_path.len()) / 8 + 8)
                .sum::<usize>() as u64
                + 8,
            cap_count: 0,
        };
        let mut request = stream_call::<watch_sink::push_params::Owned>(
            &sink.client,
            watch_sink::Client::TYPE_ID,
            0,
            size,
        );
        wire::watch_events_to_wire(&events, request.get().init_events(events.len() as u32));
        if let Err(error) = window
            .send(request.send().promise, size.word_count as usize * 8)
            .await
        {
            tracing::debug!(%error, "watch sink failed; the watch ends");
            return;
        }
    }
    let _ = window.drain().await;
}

/// Opens the directory an executor hands out (off the RPC thread: the
/// path may be on a slow file system): anywhere, or with `roots` only in
/// or beneath one of them; on a kernel with what `host` (its engine's)
/// leaves of it.
pub(crate) async fn open_directory(
    path: std::path::PathBuf,
    roots: Option<Vec<std::path::PathBuf>>,
    host: crate::sys::HostConfig,
    limits: FileLimits,
    origin: Origin,
) -> Result<directory::Client, Refusal> {
    let hold = limits.directory()?;
    let work = limits.work().clone();
    let dir = work
        .run(move || match roots {
            None => files::Directory::open(&path, &host),
            Some(roots) => files::Directory::open_within(&path, &roots, &host)?.ok_or_else(|| {
                Refusal::new(
                    crate::model::RefusalKind::NotAllowed,
                    format!(
                        "directory {:?} is outside the allowed roots ({}) of this restricted \
                         executor",
                        crate::model::excerpt(&path.display().to_string()),
                        roots
                            .iter()
                            .map(|root| format!("{:?}", root.display().to_string()))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            }),
        })
        .await?
        .with_work(work);
    Ok(capnp_rpc::new_client(DirectoryImpl::new(
        dir,
        limits,
        Rc::new(origin),
        hold,
    )))
}
