//! [`Refusal`]s as `capnp::Error`s and back: the description carries the
//! tag, so it survives any number of hops.

use crate::model::{Refusal, human_description};

impl From<Refusal> for capnp::Error {
    fn from(refusal: Refusal) -> capnp::Error {
        capnp::Error::failed(refusal.to_string())
    }
}

/// The refusal an error carries, if it carries a tag.
pub fn refusal_of(error: &capnp::Error) -> Option<Refusal> {
    Refusal::from_description(&error.extra)
}

/// A capnp error as one line for people: the peer's own words, without the
/// "remote exception:" prefixes each hop adds or capexec's machine tags.
pub fn describe(error: &capnp::Error) -> String {
    let text = human_description(&error.extra);
    match error.kind {
        capnp::ErrorKind::Disconnected if text.is_empty() => "the connection was lost".to_string(),
        capnp::ErrorKind::Disconnected => format!("the connection was lost: {text}"),
        _ if text.is_empty() => error.kind.to_string(),
        _ => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::RefusalKind;

    #[test]
    fn a_refusal_survives_the_wire() {
        for &kind in RefusalKind::ALL {
            let refusal = Refusal::new(kind, "why it was refused");
            let error = capnp::Error::from(refusal.clone());
            assert_eq!(refusal_of(&error), Some(refusal));
            assert_eq!(describe(&error), "why it was refused");
        }
        assert_eq!(refusal_of(&capnp::Error::failed("untagged".into())), None);
    }

    #[test]
    fn describe_strips_hops_and_tags() {
        let error = capnp::Error::failed(
            "remote exception: remote exception: login refused: wrong token [capexec:unauthenticated]"
                .to_string(),
        );
        assert_eq!(describe(&error), "login refused: wrong token");
        let lost = capnp::Error::disconnected("Peer disconnected.".to_string());
        assert_eq!(
            describe(&lost),
            "the connection was lost: Peer disconnected."
        );
    }
}
