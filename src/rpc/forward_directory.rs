//! A `Directory` of an upstream, seen through a forwarding hop. Plain
//! pass-through would work, but would answer `subdirectory` and
//! `readOnly` only once the upstream had, so calls pipelined on their
//! result would wait a round trip at this hop: here those two publish the
//! upstream's pipelined capability at once (`set_pipeline`), like
//! `rpc/forward.rs` does for `Executor`, and every other call goes on
//! as it came (its parameters copied whole, capabilities included). A
//! call that fails because the link to the upstream broke answers
//! `[capexec:upstream-unavailable]`, naming the hop, as forwarded starts
//! do (the caller's own connection is fine).

use std::rc::Rc;

use crate::capexec_capnp::directory;
use crate::rpc::forward::{ForwardingExecutor, upstream_lost};
use crate::rpc::settled::settled;

pub(crate) struct ForwardingDirectory {
    far: directory::Client,
    /// The upstream's name, for errors.
    hop: Rc<str>,
}

impl ForwardingDirectory {
    pub(crate) fn new(far: directory::Client, hop: Rc<str>) -> ForwardingDirectory {
        ForwardingDirectory { far, hop }
    }

    fn lost(&self, error: capnp::Error) -> capnp::Error {
        upstream_lost(&self.hop, error)
    }
}

/// A method sent on as it came, answered with the upstream's answer.
macro_rules! forwarded {
    ($($method:ident: $request:ident, $params:ident, $results:ident;)*) => {
        $(
            async fn $method(
                self: Rc<Self>,
                params: directory::$params,
                mut results: directory::$results,
            ) -> Result<(), capnp::Error> {
                let mut request = settled(&self.far).$request();
                request.set(params.get()?)?;
                let response = request
                    .send()
                    .promise
                    .await
                    .map_err(|error| self.lost(error))?;
                results.set(response.get()?)
            }
        )*
    };
}

/// A method returning a directory, whose result is published before the
/// upstream answers.
macro_rules! pipelined {
    ($($method:ident: $request:ident, $params:ident, $results:ident;)*) => {
        $(
            async fn $method(
                self: Rc<Self>,
                params: directory::$params,
                mut results: directory::$results,
            ) -> Result<(), capnp::Error> {
                let mut request = settled(&self.far).$request();
                request.set(params.get()?)?;
                let call = request.send();
                results
                    .get()
                    .set_dir(capnp_rpc::new_client(ForwardingDirectory::new(
                        call.pipeline.get_dir(),
                        Rc::clone(&self.hop),
                    )));
                results.set_pipeline()?;
                call.promise.await.map_err(|error| self.lost(error))?;
                Ok(())
            }
        )*
    };
}

impl directory::Server for ForwardingDirectory {
    forwarded! {
        stat: stat_request, StatParams, StatResults;
        list: list_request, ListParams, ListResults;
        walk: walk_request, WalkParams, WalkResults;
        read_file: read_file_request, ReadFileParams, ReadFileResults;
        write_file: write_file_request, WriteFileParams, WriteFileResults;
        write_files: write_files_request, WriteFilesParams, WriteFilesResults;
        read_files: read_files_request, ReadFilesParams, ReadFilesResults;
        upload: upload_request, UploadParams, UploadResults;
        download: download_request, DownloadParams, DownloadResults;
        mkdir: mkdir_request, MkdirParams, MkdirResults;
        remove: remove_request, RemoveParams, RemoveResults;
        rename: rename_request, RenameParams, RenameResults;
        copy: copy_request, CopyParams, CopyResults;
        symlink: symlink_request, SymlinkParams, SymlinkResults;
        readlink: readlink_request, ReadlinkParams, ReadlinkResults;
        set_permissions: set_permissions_request, SetPermissionsParams, SetPermissionsResults;
        set_times: set_times_request, SetTimesParams, SetTimesResults;
        canonicalize: canonicalize_request, CanonicalizeParams, CanonicalizeResults;
        watch: watch_request, WatchParams, WatchResults;
        info: info_request, InfoParams, InfoResults;
        search: search_request, SearchParams, SearchResults;
    }

    pipelined! {
        subdirectory: subdirectory_request, SubdirectoryParams, SubdirectoryResults;
        read_only: read_only_request, ReadOnlyParams, ReadOnlyResults;
    }

    /// The far directory's executor as a local forwarder, published before
    /// the far end answers: calls pipelined on it go on at once, and a
    /// start on it publishes its process at once too (one trip per hop).
    async fn executor(
        self: Rc<Self>,
        _: directory::ExecutorParams,
        mut results: directory::ExecutorResults,
    ) -> Result<(), capnp::Error> {
        let call = settled(&self.far).executor_request().send();
        results
            .get()
            .set_executor(capnp_rpc::new_client(ForwardingExecutor::of_far_directory(
                call.pipeline.get_executor(),
                Rc::clone(&self.hop),
            )));
        results.set_pipeline()?;
        call.promise.await.map_err(|error| self.lost(error))?;
        Ok(())
    }
}
