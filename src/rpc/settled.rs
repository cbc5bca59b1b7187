//! Calls made on what a promise capability has become, not on the promise.
//!
//! capnp-rpc 0.27 sends a call made on a promise that has resolved
//! elsewhere by copying it into a new call without its capability table;
//! when the call's parameters carry a capability (`dial`'s sink, `listen`'s
//! acceptor, a download's or a subscription's sink) the copy fails inside
//! capnp-rpc, which panics. Forwarders hold pipelined promises (the far
//! executor of an environment or restriction, a far subdirectory), so they
//! make each call on the settled capability.

use capnp::capability::FromClientHook;

/// `capability` as what it has resolved to so far (itself if it is no
/// promise, or one not yet resolved).
pub(crate) fn settled<C: FromClientHook>(capability: &C) -> C {
    let mut hook = capability.as_client_hook().add_ref();
    while let Some(next) = hook.get_resolved() {
        hook = next;
    }
    C::new(hook)
}
