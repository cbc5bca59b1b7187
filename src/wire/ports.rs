//! Ports: `PortPolicy` and `PortConnectionInfo`, both directions.

use crate::capexec_capnp::{port_connection_info, port_policy};
use crate::model::{PortConnectionInfo, PortPolicy};

/// A `List(Text)`, each entry valid UTF-8.
fn texts(list: capnp::text_list::Reader<'_>) -> capnp::Result<Vec<String>> {
    list.iter()
        .map(|item| Ok(item?.to_str()?.to_string()))
        .collect()
}

fn set_texts(mut list: capnp::text_list::Builder<'_>, items: &[String]) {
    for (index, item) in items.iter().enumerate() {
        list.set(index as u32, item.as_str());
    }
}

pub fn port_policy_from_wire(reader: port_policy::Reader<'_>) -> capnp::Result<PortPolicy> {
    Ok(PortPolicy {
        dial: reader
            .has_dial()
            .then(|| reader.get_dial().and_then(texts))
            .transpose()?,
        listen: reader
            .has_listen()
            .then(|| reader.get_listen().and_then(texts))
            .transpose()?,
    })
}

pub fn port_policy_to_wire(policy: &PortPolicy, mut builder: port_policy::Builder<'_>) {
    if let Some(dial) = &policy.dial {
        set_texts(builder.reborrow().init_dial(dial.len() as u32), dial);
    }
    if let Some(listen) = &policy.listen {
        set_texts(builder.reborrow().init_listen(listen.len() as u32), listen);
    }
}

pub fn port_info_from_wire(
    reader: port_connection_info::Reader<'_>,
) -> capnp::Result<PortConnectionInfo> {
    Ok(PortConnectionInfo {
        local: reader.get_local()?.to_str()?.to_string(),
        peer: reader.get_peer()?.to_str()?.to_string(),
    })
}

pub fn port_info_to_wire(
    info: &PortConnectionInfo,
    mut builder: port_connection_info::Builder<'_>,
) {
    builder.set_local(info.local.as_str());
    builder.set_peer(info.peer.as_str());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_policies_survive_the_wire_with_null_and_empty_apart() {
        for policy in [
            PortPolicy::default(),
            PortPolicy {
                dial: Some(vec!["tcp:127.0.0.1:*".into(), "unix:/run/app/".into()]),
                listen: Some(Vec::new()),
            },
            PortPolicy {
                dial: None,
                listen: Some(vec!["tcp:localhost:8000-8999".into()]),
            },
        ] {
            let mut message = capnp::message::Builder::new_default();
            port_policy_to_wire(&policy, message.init_root());
            let reader = message
                .get_root_as_reader::<port_policy::Reader<'_>>()
                .expect("root");
            assert_eq!(port_policy_from_wire(reader).expect("decode"), policy);
        }
    }

    #[test]
    fn connection_info_survives_the_wire() {
        let info = PortConnectionInfo {
            local: "tcp:127.0.0.1:40312".into(),
            peer: "unix:/run/db.sock".into(),
        };
        let mut message = capnp::message::Builder::new_default();
        port_info_to_wire(&info, message.init_root());
        let reader = message
            .get_root_as_reader::<port_connection_info::Reader<'_>>()
            .expect("root");
        assert_eq!(port_info_from_wire(reader).expect("decode"), info);
    }
}
