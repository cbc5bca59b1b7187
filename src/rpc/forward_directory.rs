//! A `Directory` of an upstream, seen through a forwarding hop. Plain
//! pass-through would work, but would answer `subdirectory` and
//! `readOnly` only once the upstream had, so calls pipelined on their
//! result would wait a round trip at this hop: here those two (and
//! `executor`) publish the upstream's pipelined capability at once, like
//! `rpc/forward.rs` does for `Executor`, and every other call goes on
//! as it came (its parameters and answer copied whole, capabilities
//! included): one line per method, in the order of the schema, through
//! `rpc/forwarding.rs`. A
//! call that fails because the link to the upstream broke answers
//! `[capexec:upstream-unavailable]`, naming the hop, as forwarded starts
//! do (the caller's own connection is fine).

use std::rc::Rc;

use crate::capexec_capnp::{directory, executor};
use crate::rpc::forward::{ForwardingExecutor, upstream_lost};
use crate::rpc::forwarding::{Forwarder, forward};
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
}

impl Forwarder for ForwardingDirectory {
    type Far = directory::Client;

    async fn far(&self) -> Result<directory::Client, capnp::Error> {
        Ok(settled(&self.far))
    }

    fn lost(&self, error: capnp::Error) -> capnp::Error {
        upstream_lost(&self.hop, error)
    }

    fn hop(&self) -> Rc<str> {
        Rc::clone(&self.hop)
    }
}

/// The far directory's executor as a local forwarder: calls pipelined on
/// it go on at once, and a start on it publishes its process at once too
/// (one trip per hop).
fn far_executor(executor: executor::Client, hop: Rc<str>) -> ForwardingExecutor {
    ForwardingExecutor::of_far_directory(executor, hop)
}

impl directory::Server for ForwardingDirectory {
    forward! { directory;
        stat: stat_request, StatParams, StatResults;
        list: list_request, ListParams, ListResults;
        walk: walk_request, WalkParams, WalkResults;
        read_file: read_file_request, ReadFileParams, ReadFileResults;
        write_file: write_file_request, WriteFileParams, WriteFileResults;
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
        subdirectory: subdirectory_request, SubdirectoryParams, SubdirectoryResults [
            publish set_dir(get_dir, ForwardingDirectory::new)
        ];
        read_only: read_only_request, ReadOnlyParams, ReadOnlyResults [
            publish set_dir(get_dir, ForwardingDirectory::new)
        ];
        watch: watch_request, WatchParams, WatchResults;
        info: info_request, InfoParams, InfoResults;
        executor: executor_request, ExecutorParams, ExecutorResults [
            publish set_executor(get_executor, far_executor)
        ];
        write_files: write_files_request, WriteFilesParams, WriteFilesResults;
        read_files: read_files_request, ReadFilesParams, ReadFilesResults;
        search: search_request, SearchParams, SearchResults;
    }
}
