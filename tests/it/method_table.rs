//! Every method of `Executor` and `Directory`, read from the schema
//! (`schema/codegen-request.bin`), is listed here with how a forwarding hop
//! serves it; a method the schema gains without a line here fails the
//! test, and so does one a hop leaves out: each is called, with empty
//! parameters, on every backend (the chained one through a forwarding
//! hop), and no answer may be `unimplemented`. A forwarder that forgets a
//! method compiles; this catches it.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use capexec::client::Directory;
use capnp::schema_capnp::{code_generator_request, node};
use common::Ctx;
use common::data::TempDir;

/// How a forwarding hop serves a method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hop {
    /// Sent on whole, answered with the far end's answer.
    Forwarded,
    /// Its capability result is published before the far end answers.
    Pipelined,
    /// Answered by the hop with the far end's answer amended (its own name
    /// in the environment path, the features both ends have).
    Amended,
}

const EXECUTOR: &[(&str, Hop)] = &[
    ("start", Hop::Pipelined),
    ("info", Hop::Amended),
    ("environments", Hop::Forwarded),
    ("environment", Hop::Pipelined),
    ("restore", Hop::Forwarded),
    ("restrict", Hop::Pipelined),
    ("directory", Hop::Pipelined),
    ("dial", Hop::Forwarded),
    ("listen", Hop::Forwarded),
];

const DIRECTORY: &[(&str, Hop)] = &[
    ("stat", Hop::Forwarded),
    ("list", Hop::Forwarded),
    ("walk", Hop::Forwarded),
    ("readFile", Hop::Forwarded),
    ("writeFile", Hop::Forwarded),
    ("upload", Hop::Forwarded),
    ("download", Hop::Forwarded),
    ("mkdir", Hop::Forwarded),
    ("remove", Hop::Forwarded),
    ("rename", Hop::Forwarded),
    ("copy", Hop::Forwarded),
    ("symlink", Hop::Forwarded),
    ("readlink", Hop::Forwarded),
    ("setPermissions", Hop::Forwarded),
    ("setTimes", Hop::Forwarded),
    ("canonicalize", Hop::Forwarded),
    ("subdirectory", Hop::Pipelined),
    ("readOnly", Hop::Pipelined),
    ("watch", Hop::Forwarded),
    ("info", Hop::Forwarded),
    ("executor", Hop::Pipelined),
    ("writeFiles", Hop::Forwarded),
    ("readFiles", Hop::Forwarded),
    ("search", Hop::Forwarded),
];

/// The committed schema, as the code generator was given it.
fn schema() -> capnp::message::Reader<capnp::serialize::OwnedSegments> {
    let bytes = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/schema/codegen-request.bin"
    ))
    .expect("the committed code generation request");
    capnp::serialize::read_message(bytes.as_slice(), capnp::message::ReaderOptions::new())
        .expect("a message")
}

/// The schema's interfaces by name: their id and their methods' names in
/// ordinal order.
fn interfaces() -> BTreeMap<String, (u64, Vec<String>)> {
    let message = schema();
    let request = message
        .get_root::<code_generator_request::Reader<'_>>()
        .expect("a code generation request");
    let mut found = BTreeMap::new();
    for node in request.get_nodes().expect("nodes") {
        let Ok(node::Interface(interface)) = node.which() else {
            continue;
        };
        let name = node
            .get_display_name()
            .expect("name")
            .to_string()
            .expect("utf-8");
        let short = name[node.get_display_name_prefix_length() as usize..].to_string();
        let methods = interface
            .get_methods()
            .expect("methods")
            .iter()
            .map(|method| method.get_name().expect("name").to_string().expect("utf-8"))
            .collect();
        found.insert(short, (node.get_id(), methods));
    }
    found
}

#[test]
fn every_method_of_the_schema_is_in_the_table() {
    let interfaces = interfaces();
    for (interface, table) in [("Executor", EXECUTOR), ("Directory", DIRECTORY)] {
        let (_, methods) = &interfaces[interface];
        let listed: Vec<&str> = table.iter().map(|(name, _)| *name).collect();
        assert_eq!(
            methods.iter().map(String::as_str).collect::<Vec<_>>(),
            listed,
            "{interface}: the schema's methods in ordinal order, against this table: \
             a new method needs its line here (and its forwarding in src/rpc/forward*.rs)"
        );
    }
}

/// The results of the methods whose capability a hop publishes before the
/// far end answers, field by field: such results cannot be copied whole
/// afterwards (capnp 0.27 panics overwriting a struct that holds a
/// capability), so `src/rpc/forward*.rs` sets each field by hand. Every
/// field that is not a capability is listed here with what the hop does:
/// a field the schema gains fails this test until the forwarder copies it
/// (or says why it is the hop's own) and this list names it.
const SET_BY_HAND: &[(&str, &str, &str)] = &[
    (
        "Executor",
        "start",
        "stdioPassed: hop-local (the hop passes no descriptors)",
    ),
    ("Executor", "dial", "info: copied from the far answer"),
    (
        "Executor",
        "dial",
        "directTicket: hop-local (the hop asks the far end for no direct channel)",
    ),
    ("Executor", "listen", "address: copied from the far answer"),
];

#[test]
fn every_field_of_a_pipelined_result_is_forwarded() {
    let message = schema();
    let request = message
        .get_root::<code_generator_request::Reader<'_>>()
        .expect("a code generation request");
    let nodes: BTreeMap<u64, node::Reader<'_>> = request
        .get_nodes()
        .expect("nodes")
        .iter()
        .map(|node| (node.get_id(), node))
        .collect();
    let text = |reader: capnp::Result<capnp::text::Reader<'_>>| {
        reader.expect("text").to_string().expect("utf-8")
    };
    let mut found = Vec::new();
    for (interface, table) in [("Executor", EXECUTOR), ("Directory", DIRECTORY)] {
        let node = nodes
            .values()
            .find(|node| {
                let name = text(node.get_display_name());
                name[node.get_display_name_prefix_length() as usize..] == *interface
            })
            .expect("the interface");
        let Ok(node::Interface(methods)) = node.which() else {
            panic!("{interface} is an interface");
        };
        for method in methods.get_methods().expect("methods") {
            let name = text(method.get_name());
            let published = table
                .iter()
                .any(|(listed, hop)| *listed == name && *hop != Hop::Amended)
                && nodes
                    .get(&method.get_result_struct_type())
                    .is_some_and(|results| {
                        let Ok(node::Struct(results)) = results.which() else {
                            return false;
                        };
                        results.get_fields().expect("fields").iter().any(|field| {
                            matches!(field.which(), Ok(capnp::schema_capnp::field::Slot(slot))
                            if matches!(slot.get_type().expect("type").which(),
                                Ok(capnp::schema_capnp::type_::Interface(_))))
                        })
                    });
            if !published {
                continue;
            }
            let Ok(node::Struct(results)) = nodes[&method.get_result_struct_type()].which() else {
                continue;
            };
            for field in results.get_fields().expect("fields") {
                let is_capability = matches!(field.which(), Ok(capnp::schema_capnp::field::Slot(slot))
                    if matches!(slot.get_type().expect("type").which(),
                        Ok(capnp::schema_capnp::type_::Interface(_))));
                if !is_capability {
                    found.push((interface, name.clone(), text(field.get_name())));
                }
            }
        }
    }
    let listed: Vec<(&str, String, String)> = SET_BY_HAND
        .iter()
        .map(|(interface, method, field)| {
            let field = field.split(':').next().unwrap_or_default();
            (*interface, method.to_string(), field.to_string())
        })
        .collect();
    assert_eq!(
        found, listed,
        "the fields other than capabilities of results a hop publishes early, against \
         SET_BY_HAND: a new one must be set by hand in src/rpc/forward*.rs and listed"
    );
}

/// What calling `ordinal` of `interface` on `client` with empty parameters
/// answers, in words: never `unimplemented`.
async fn called_empty(client: &capnp::capability::Client, interface: u64, ordinal: u16) -> String {
    let request = client
        .new_call::<capnp::any_pointer::Owned, capnp::any_pointer::Owned>(interface, ordinal, None);
    let answer = tokio::time::timeout(Duration::from_secs(30), request.send().promise).await;
    match answer {
        Err(_) => "no answer in 30 s".to_string(),
        Ok(Ok(_)) => "answered".to_string(),
        Ok(Err(error)) if error.kind == capnp::ErrorKind::Unimplemented => {
            format!("unimplemented: {error}")
        }
        Ok(Err(_)) => "refused".to_string(),
    }
}

async fn every_method_is_answered_through_every_backend(ctx: Ctx) {
    let interfaces = interfaces();
    let temp = TempDir::new("method-table");
    let directory = Directory::open(&ctx.executor, temp.path());
    for (interface, table, client) in [
        ("Executor", EXECUTOR, ctx.executor.clone().client),
        ("Directory", DIRECTORY, directory.client().clone().client),
    ] {
        let id = interfaces[interface].0;
        for (ordinal, (name, _)) in table.iter().enumerate() {
            let answer = called_empty(&client, id, ordinal as u16).await;
            assert!(
                answer == "answered" || answer == "refused",
                "{interface}.{name} on {:?}: {answer}",
                ctx.backend
            );
        }
    }
}

backend_tests!(every_method_is_answered_through_every_backend);
