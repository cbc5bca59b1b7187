//! Calls made on what a promise capability has become, not on the promise.
//!
//! capnp-rpc sends a call made on a promise that has resolved elsewhere by
//! copying its parameters into a new call to what the promise became.
//! Forwarders hold pipelined promises (the far executor of an environment
//! or restriction, a far subdirectory), so they make each call on the
//! settled capability and skip that copy. (0.27.3 also lost the capability
//! parameters in the copy and panicked; `vendor/capnp-rpc` fixes that for
//! the calls that pass through a server without code of ours.)

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
