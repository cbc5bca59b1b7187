//! The values of `Directory` calls (stats, entries, options, watch events,
//! directory info), both directions.

use std::os::unix::ffi::OsStrExt;

use crate::capexec_capnp as wire;
use crate::model::{
    CopyOptions, DirEntry, DirectoryInfo, FileKind, FileStat, SearchMatch, SearchOptions,
    SearchResult, WalkOptions, WatchEvent, WatchEventKind, WriteOptions,
};
use crate::wire::lists::path;

macro_rules! same_enum {
    ($to:ident, $from:ident, $model:ident, $wire:ident, [$($variant:ident),* $(,)?]) => {
        pub fn $to(value: $model) -> wire::$wire {
            match value {
                $($model::$variant => wire::$wire::$variant,)*
            }
        }

        pub fn $from(value: wire::$wire) -> $model {
            match value {
                $(wire::$wire::$variant => $model::$variant,)*
            }
        }
    };
}

same_enum!(
    file_kind_to_wire,
    file_kind_from_wire,
    FileKind,
    FileKind,
    [
        Unknown,
        File,
        Directory,
        Symlink,
        Fifo,
        Socket,
        CharDevice,
        BlockDevice
    ]
);

same_enum!(
    watch_event_kind_to_wire,
    watch_event_kind_from_wire,
    WatchEventKind,
    WatchEventKind,
    [
        Created, Modified, Removed, Renamed, Attributes, Overflow, Gone
    ]
);

pub fn file_stat_to_wire(stat: &FileStat, mut builder: wire::file_stat::Builder<'_>) {
    builder.set_kind(file_kind_to_wire(stat.kind));
    builder.set_size(stat.size);
    builder.set_permissions(stat.permissions);
    builder.set_modified_ns(stat.modified_ns);
    builder.set_accessed_ns(stat.accessed_ns);
    builder.set_changed_ns(stat.changed_ns);
    builder.set_uid(stat.uid);
    builder.set_gid(stat.gid);
    builder.set_links(stat.links);
    builder.set_inode(stat.inode);
    builder.set_device(stat.device);
    builder.set_version(&stat.version);
}

pub fn file_stat_from_wire(reader: wire::file_stat::Reader<'_>) -> capnp::Result<FileStat> {
    Ok(FileStat {
        // A kind this build does not know is `unknown`.
        kind: reader
            .get_kind()
            .map_or(FileKind::Unknown, file_kind_from_wire),
        size: reader.get_size(),
        permissions: reader.get_permissions(),
        modified_ns: reader.get_modified_ns(),
        accessed_ns: reader.get_accessed_ns(),
        changed_ns: reader.get_changed_ns(),
        uid: reader.get_uid(),
        gid: reader.get_gid(),
        links: reader.get_links(),
        inode: reader.get_inode(),
        device: reader.get_device(),
        version: reader.get_version()?.to_vec(),
    })
}

/// Fills `list` (initialised with `entries.len()` entries).
pub fn dir_entries_to_wire(
    entries: &[DirEntry],
    mut list: capnp::struct_list::Builder<'_, wire::dir_entry::Owned>,
) {
    for (index, entry) in entries.iter().enumerate() {
        let mut builder = list.reborrow().get(index as u32);
        builder.set_path(&entry.path);
        if let Some(stat) = &entry.stat {
            file_stat_to_wire(stat, builder.reborrow().init_stat());
        }
        if !entry.link_target.is_empty() {
            builder.set_link_target(&entry.link_target);
        }
        if let Some(error) = &entry.error {
            builder.set_error(error);
        }
    }
}

pub fn dir_entries_from_wire(
    list: capnp::struct_list::Reader<'_, wire::dir_entry::Owned>,
) -> capnp::Result<Vec<DirEntry>> {
    list.iter()
        .map(|entry| {
            let error = entry.get_error()?.to_string()?;
            Ok(DirEntry {
                path: entry.get_path()?.to_vec(),
                stat: if entry.has_stat() {
                    Some(file_stat_from_wire(entry.get_stat()?)?)
                } else {
                    None
                },
                link_target: entry.get_link_target()?.to_vec(),
                error: (!error.is_empty()).then_some(error),
            })
        })
        .collect()
}

/// The message size of a push of `entries`, so that it is allocated once.
pub fn dir_entries_message_size(entries: &[DirEntry]) -> capnp::MessageSize {
    let bytes: usize = entries
        .iter()
        .map(|entry| {
            entry.path.len()
                + entry.link_target.len()
                + entry.error.as_ref().map_or(0, String::len)
                + 256
        })
        .sum();
    capnp::MessageSize {
        word_count: (bytes / 8 + 16) as u64,
        cap_count: 0,
    }
}

fn set_data_list(builder: capnp::data_list::Builder<'_>, items: &[Vec<u8>]) {
    let mut builder = builder;
    for (index, item) in items.iter().enumerate() {
        builder.set(index as u32, item);
    }
}

fn data_list(reader: capnp::data_list::Reader<'_>) -> capnp::Result<Vec<Vec<u8>>> {
    reader.iter().map(|item| item.map(<[u8]>::to_vec)).collect()
}

pub fn walk_options_to_wire(options: &WalkOptions, mut builder: wire::walk_options::Builder<'_>) {
    builder.set_max_depth(options.max_depth);
    builder.set_max_entries(options.max_entries);
    if !options.include.is_empty() {
        set_data_list(
            builder
                .reborrow()
                .init_include(options.include.len() as u32),
            &options.include,
        );
    }
    if !options.exclude.is_empty() {
        set_data_list(
            builder
                .reborrow()
                .init_exclude(options.exclude.len() as u32),
            &options.exclude,
        );
    }
}

pub fn walk_options_from_wire(
    reader: wire::walk_options::Reader<'_>,
) -> capnp::Result<WalkOptions> {
    Ok(WalkOptions {
        max_depth: reader.get_max_depth(),
        max_entries: reader.get_max_entries(),
        include: data_list(reader.get_include()?)?,
        exclude: data_list(reader.get_exclude()?)?,
    })
}

pub fn write_options_to_wire(
    options: &WriteOptions,
    mut builder: wire::write_options::Builder<'_>,
) {
    builder.set_exclusive(options.exclusive);
    builder.set_must_exist(options.must_exist);
    builder.set_in_place(options.in_place);
    match (options.permissions, options.new_file_permissions) {
        (Some(bits), _) => builder.reborrow().init_permissions().set_set(bits),
        (None, Some(bits)) => builder.reborrow().init_permissions().set_new_file(bits),
        (None, None) => builder.reborrow().init_permissions().set_keep(()),
    }
    builder.set_if_version(&options.if_version);
    builder.set_create_parents(options.create_parents);
    match options.modified_ns {
        None => builder.reborrow().init_modified().set_now(()),
        Some(at) => builder.reborrow().init_modified().set_at(at),
    }
    builder.set_sync(options.sync);
}

pub fn write_options_from_wire(
    reader: wire::write_options::Reader<'_>,
) -> capnp::Result<WriteOptions> {
    use wire::write_options::{modified, permissions};
    Ok(WriteOptions {
        exclusive: reader.get_exclusive(),
        must_exist: reader.get_must_exist(),
        in_place: reader.get_in_place(),
        permissions: match reader.get_permissions().which()? {
            permissions::Set(bits) => Some(bits),
            permissions::Keep(()) | permissions::NewFile(_) => None,
        },
        new_file_permissions: match reader.get_permissions().which()? {
            permissions::NewFile(bits) => Some(bits),
            permissions::Keep(()) | permissions::Set(_) => None,
        },
        if_version: reader.get_if_version()?.to_vec(),
        create_parents: reader.get_create_parents(),
        modified_ns: match reader.get_modified().which()? {
            modified::Now(()) => None,
            modified::At(at) => Some(at),
        },
        sync: reader.get_sync(),
    })
}

pub fn copy_options_to_wire(options: &CopyOptions, mut builder: wire::copy_options::Builder<'_>) {
    builder.set_recursive(options.recursive);
    builder.set_no_replace(options.no_replace);
    builder.set_preserve(options.preserve);
}

pub fn copy_options_from_wire(reader: wire::copy_options::Reader<'_>) -> CopyOptions {
    CopyOptions {
        recursive: reader.get_recursive(),
        no_replace: reader.get_no_replace(),
        preserve: reader.get_preserve(),
    }
}

/// Fills `list` (initialised with `events.len()` entries).
pub fn watch_events_to_wire(
    events: &[WatchEvent],
    mut list: capnp::struct_list::Builder<'_, wire::watch_event::Owned>,
) {
    for (index, event) in events.iter().enumerate() {
        let mut builder = list.reborrow().get(index as u32);
        builder.set_kind(watch_event_kind_to_wire(event.kind));
        builder.set_path(&event.path);
        if !event.to_path.is_empty() {
            builder.set_to_path(&event.to_path);
        }
        builder.set_is_directory(event.is_directory);
    }
}

pub fn watch_events_from_wire(
    list: capnp::struct_list::Reader<'_, wire::watch_event::Owned>,
) -> capnp::Result<Vec<WatchEvent>> {
    list.iter()
        .map(|event| {
            Ok(WatchEvent {
                // A kind this build does not know means: look again.
                kind: event
                    .get_kind()
                    .map_or(WatchEventKind::Overflow, watch_event_kind_from_wire),
                path: event.get_path()?.to_vec(),
                to_path: event.get_to_path()?.to_vec(),
                is_directory: event.get_is_directory(),
            })
        })
        .collect()
}

pub fn directory_info_to_wire(
    info: &DirectoryInfo,
    mut builder: wire::directory_info::Builder<'_>,
) {
    builder.set_path(info.path.as_os_str().as_bytes());
    builder.set_read_only(info.read_only);
}

pub fn directory_info_from_wire(
    reader: wire::directory_info::Reader<'_>,
) -> capnp::Result<DirectoryInfo> {
    Ok(DirectoryInfo {
        path: path(reader.get_path()?),
        read_only: reader.get_read_only(),
    })
}

pub fn search_options_to_wire(
    options: &SearchOptions,
    mut builder: wire::search_options::Builder<'_>,
) {
    builder.set_pattern(options.pattern.as_str());
    builder.set_case_insensitive(options.case_insensitive);
    builder.set_max_depth(options.max_depth);
    if !options.include.is_empty() {
        set_data_list(
            builder
                .reborrow()
                .init_include(options.include.len() as u32),
            &options.include,
        );
    }
    if !options.exclude.is_empty() {
        set_data_list(
            builder
                .reborrow()
                .init_exclude(options.exclude.len() as u32),
            &options.exclude,
        );
    }
    builder.set_max_matches(options.max_matches);
    builder.set_max_file_bytes(options.max_file_bytes);
}

pub fn search_options_from_wire(
    reader: wire::search_options::Reader<'_>,
) -> capnp::Result<SearchOptions> {
    Ok(SearchOptions {
        pattern: reader.get_pattern()?.to_str()?.to_string(),
        case_insensitive: reader.get_case_insensitive(),
        max_depth: reader.get_max_depth(),
        include: data_list(reader.get_include()?)?,
        exclude: data_list(reader.get_exclude()?)?,
        max_matches: reader.get_max_matches(),
        max_file_bytes: reader.get_max_file_bytes(),
    })
}

pub fn search_result_to_wire(result: &SearchResult, mut builder: wire::search_result::Builder<'_>) {
    let mut list = builder.reborrow().init_matches(result.matches.len() as u32);
    for (index, found) in result.matches.iter().enumerate() {
        let mut item = list.reborrow().get(index as u32);
        item.set_path(&found.path);
        item.set_line_number(found.line_number);
        item.set_line_bytes(found.line_bytes);
        item.set_text(&found.text);
        item.set_text_offset(found.text_offset);
        item.set_match_start(found.match_start);
        item.set_match_end(found.match_end);
    }
    builder.set_files_searched(result.files_searched);
    builder.set_binary_skipped(result.binary_skipped);
    builder.set_too_large_skipped(result.too_large_skipped);
    builder.set_unreadable(result.unreadable);
    if let Some(error) = &result.first_error {
        builder.set_first_error(error.as_str());
    }
    builder.set_truncated(result.truncated);
}

pub fn search_result_from_wire(
    reader: wire::search_result::Reader<'_>,
) -> capnp::Result<SearchResult> {
    let matches = reader
        .get_matches()?
        .iter()
        .map(|item| {
            Ok(SearchMatch {
                path: item.get_path()?.to_vec(),
                line_number: item.get_line_number(),
                line_bytes: item.get_line_bytes(),
                text: item.get_text()?.to_vec(),
                text_offset: item.get_text_offset(),
                match_start: item.get_match_start(),
                match_end: item.get_match_end(),
            })
        })
        .collect::<capnp::Result<Vec<_>>>()?;
    let first_error = reader.get_first_error()?.to_str()?;
    Ok(SearchResult {
        matches,
        files_searched: reader.get_files_searched(),
        binary_skipped: reader.get_binary_skipped(),
        too_large_skipped: reader.get_too_large_skipped(),
        unreadable: reader.get_unreadable(),
        first_error: (!first_error.is_empty()).then(|| first_error.to_string()),
        truncated: reader.get_truncated(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat() -> FileStat {
        FileStat {
            kind: FileKind::Symlink,
            size: 1,
            permissions: 0o4755,
            modified_ns: -2,
            accessed_ns: 3,
            changed_ns: 4,
            uid: 5,
            gid: 6,
            links: 7,
            inode: 8,
            device: 9,
            version: vec![10, 11],
        }
    }

    #[test]
    fn entries_with_every_field_set_round_trip() {
        let entries = vec![
            DirEntry {
                path: b"a/\xffb".to_vec(),
                stat: Some(stat()),
                link_target: b"../t".to_vec(),
                error: None,
            },
            DirEntry {
                path: b"gone".to_vec(),
                stat: None,
                link_target: Vec::new(),
                error: Some("cannot be entered".into()),
            },
        ];
        let mut message = capnp::message::Builder::new_default();
        let list = message.initn_root::<capnp::struct_list::Builder<'_, wire::dir_entry::Owned>>(2);
        dir_entries_to_wire(&entries, list);
        let reader = message
            .get_root_as_reader::<capnp::struct_list::Reader<'_, wire::dir_entry::Owned>>()
            .expect("root");
        assert_eq!(dir_entries_from_wire(reader).expect("read"), entries);
    }

    #[test]
    fn options_with_every_field_set_round_trip() {
        let write = WriteOptions {
            exclusive: true,
            must_exist: true,
            in_place: true,
            permissions: Some(0o640),
            new_file_permissions: None,
            if_version: vec![1, 2, 3],
            create_parents: true,
            modified_ns: Some(-5),
            sync: true,
        };
        let mut message = capnp::message::Builder::new_default();
        write_options_to_wire(&write, message.init_root());
        let reader = message.get_root_as_reader().expect("root");
        assert_eq!(write_options_from_wire(reader).expect("read"), write);
        let new_file = WriteOptions {
            new_file_permissions: Some(0o751),
            ..WriteOptions::default()
        };
        let mut message = capnp::message::Builder::new_default();
        write_options_to_wire(&new_file, message.init_root());
        let reader = message.get_root_as_reader().expect("root");
        assert_eq!(write_options_from_wire(reader).expect("read"), new_file);
        let defaults = WriteOptions::default();
        let mut message = capnp::message::Builder::new_default();
        write_options_to_wire(&defaults, message.init_root());
        let reader = message.get_root_as_reader().expect("root");
        assert_eq!(write_options_from_wire(reader).expect("read"), defaults);

        let walk = WalkOptions {
            max_depth: 3,
            max_entries: 9,
            include: vec![b"**/*.rs".to_vec()],
            exclude: vec![b"target".to_vec(), b".git".to_vec()],
        };
        let mut message = capnp::message::Builder::new_default();
        walk_options_to_wire(&walk, message.init_root());
        let reader = message.get_root_as_reader().expect("root");
        assert_eq!(walk_options_from_wire(reader).expect("read"), walk);

        let copy = CopyOptions {
            recursive: true,
            no_replace: true,
            preserve: true,
        };
        let mut message = capnp::message::Builder::new_default();
        copy_options_to_wire(&copy, message.init_root());
        let reader = message.get_root_as_reader().expect("root");
        assert_eq!(copy_options_from_wire(reader), copy);
    }

    #[test]
    fn search_options_and_results_with_every_field_set_round_trip() {
        let options = SearchOptions {
            pattern: "fn \\w+\\(".into(),
            case_insensitive: true,
            max_depth: 4,
            include: vec![b"**/*.rs".to_vec()],
            exclude: vec![b"target".to_vec()],
            max_matches: 7,
            max_file_bytes: 99,
        };
        let mut message = capnp::message::Builder::new_default();
        search_options_to_wire(&options, message.init_root());
        let reader = message.get_root_as_reader().expect("root");
        assert_eq!(search_options_from_wire(reader).expect("read"), options);

        let result = SearchResult {
            matches: vec![SearchMatch {
                path: b"a/\xffb".to_vec(),
                line_number: 12,
                line_bytes: 2000,
                text: b"window".to_vec(),
                text_offset: 872,
                match_start: 1000,
                match_end: 1004,
            }],
            files_searched: 3,
            binary_skipped: 4,
            too_large_skipped: 5,
            unreadable: 6,
            first_error: Some("search \"x\": permission denied".into()),
            truncated: true,
        };
        let mut message = capnp::message::Builder::new_default();
        search_result_to_wire(&result, message.init_root());
        let reader = message.get_root_as_reader().expect("root");
        assert_eq!(search_result_from_wire(reader).expect("read"), result);
        let empty = SearchResult::default();
        let mut message = capnp::message::Builder::new_default();
        search_result_to_wire(&empty, message.init_root());
        let reader = message.get_root_as_reader().expect("root");
        assert_eq!(search_result_from_wire(reader).expect("read"), empty);
    }

    #[test]
    fn watch_events_and_info_round_trip() {
        let events = vec![
            WatchEvent {
                kind: WatchEventKind::Renamed,
                path: b"a".to_vec(),
                to_path: b"b".to_vec(),
                is_directory: true,
            },
            WatchEvent::overflow(),
        ];
        let mut message = capnp::message::Builder::new_default();
        let list =
            message.initn_root::<capnp::struct_list::Builder<'_, wire::watch_event::Owned>>(2);
        watch_events_to_wire(&events, list);
        let reader = message
            .get_root_as_reader::<capnp::struct_list::Reader<'_, wire::watch_event::Owned>>()
            .expect("root");
        assert_eq!(watch_events_from_wire(reader).expect("read"), events);

        let info = DirectoryInfo {
            path: "/srv/x".into(),
            read_only: true,
        };
        let mut message = capnp::message::Builder::new_default();
        directory_info_to_wire(&info, message.init_root());
        let reader = message.get_root_as_reader().expect("root");
        assert_eq!(directory_info_from_wire(reader).expect("read"), info);
    }
}
