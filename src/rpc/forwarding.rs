//! The one forwarding mechanism of a hop, shared by every forwarder
//! (`Executor` in `forward.rs`, `Directory` in `forward_directory.rs`):
//! [`forward!`] writes a method from one line. Its parameters go on whole
//! (a field this server does not know yet reaches the far end), with the
//! hop's own fields cleared explicitly (`clear`). Then either
//!
//! - the far end's answer comes back whole (a line with no `[...]`), or
//! - the answer's capabilities are published before the far end answers
//!   (`publish`, each wrapped in a local forwarder where one is named, so
//!   calls pipelined on it go on at once), and once it has answered its
//!   other fields are copied (`copy`): an answer holding a capability
//!   cannot be overwritten whole (capnp 0.27's builder panics), so
//!   `tests/it/method_table.rs` lists those fields from the schema and
//!   fails on one the line does not name.
//!
//! A call that fails because the link to the far end broke is the hop's
//! failure, as [`Forwarder::lost`] says. Methods a hop answers in part
//! itself (an executor's `start`, `info`, `environment`, `restrict`) are
//! written out beside the line-per-method ones.

use std::rc::Rc;

/// A local capability whose calls go on to a far one.
pub(crate) trait Forwarder {
    /// The far capability's client.
    type Far;

    /// The far capability calls go to now.
    async fn far(&self) -> Result<Self::Far, capnp::Error>;

    /// `error` of a call to the far end, as this hop answers it.
    fn lost(&self, error: capnp::Error) -> capnp::Error;

    /// The far end's name, for the errors of forwarders made from this one.
    fn hop(&self) -> Rc<str>;
}

/// What a setter answers, `()` or a result, as a result.
pub(crate) trait Set {
    fn done(self) -> Result<(), capnp::Error>;
}

impl Set for () {
    fn done(self) -> Result<(), capnp::Error> {
        Ok(())
    }
}

impl Set for Result<(), capnp::Error> {
    fn done(self) -> Result<(), capnp::Error> {
        self
    }
}

/// Methods of `interface` forwarded, one line each:
///
/// ```text
/// method: method_request, MethodParams, MethodResults;
/// method: method_request, MethodParams, MethodResults [
///     clear set_hop_local(value);
///     publish set_capability(get_capability, LocalForwarder::new);
///     copy set_field(get_field)
/// ];
/// ```
///
/// The first is answered whole; in the second, `clear` and `copy` are
/// optional and a published capability's wrapper too (a function of the
/// far capability and the hop's name).
macro_rules! forward {
    ($interface:ident; $(
        $method:ident: $request:ident, $params:ident, $results:ident $([$($how:tt)*])?;
    )*) => {
        $(
            $crate::rpc::forwarding::forward!(
                @one $interface, $method, $request, $params, $results, [$($($how)*)?]
            );
        )*
    };

    (@one $interface:ident, $method:ident, $request:ident, $params:ident, $results:ident, [
        $(clear $($clear:ident($value:expr)),+;)?
    ]) => {
        async fn $method(
            self: ::std::rc::Rc<Self>,
            params: $interface::$params,
            mut results: $interface::$results,
        ) -> ::std::result::Result<(), ::capnp::Error> {
            let request = $crate::rpc::forwarding::forward!(
                @request self, params, $request $(, $($clear($value)),+)?
            );
            let response = request
                .send()
                .promise
                .await
                .map_err(|error| $crate::rpc::forwarding::Forwarder::lost(&*self, error))?;
            results.set(response.get()?)
        }
    };

    (@one $interface:ident, $method:ident, $request:ident, $params:ident, $results:ident, [
        $(clear $($clear:ident($value:expr)),+;)?
        publish $($publish:ident($pipelined:ident $(, $wrap:path)?)),+
        $(; copy $($copy:ident($far:ident)),+)?
    ]) => {
        async fn $method(
            self: ::std::rc::Rc<Self>,
            params: $interface::$params,
            mut results: $interface::$results,
        ) -> ::std::result::Result<(), ::capnp::Error> {
            let request = $crate::rpc::forwarding::forward!(
                @request self, params, $request $(, $($clear($value)),+)?
            );
            let call = request.send();
            $(
                results.get().$publish(
                    $crate::rpc::forwarding::forward!(
                        @wrap self, call.pipeline.$pipelined() $(, $wrap)?
                    )
                );
            )+
            results.set_pipeline()?;
            #[allow(unused_variables)]
            let response = call.promise.await.map_err(|error| $crate::rpc::forwarding::Forwarder::lost(&*self, error))?;
            $($(
                $crate::rpc::forwarding::Set::done(results.get().$copy(response.get()?.$far()?))?;
            )+)?
            Ok(())
        }
    };

    // The request to the far end: the parameters whole, then the hop's own
    // fields cleared.
    (@request $self:ident, $params:ident, $request:ident $(, $clear:ident($value:expr))*) => {{
        let mut request = $crate::rpc::forwarding::Forwarder::far(&*$self)
            .await?
            .$request();
        request.set($params.get()?)?;
        $($crate::rpc::forwarding::Set::done(request.get().$clear($value))?;)*
        request
    }};

    (@wrap $self:ident, $far:expr) => { $far };
    (@wrap $self:ident, $far:expr, $wrap:path) => {
        ::capnp_rpc::new_client($wrap($far, $crate::rpc::forwarding::Forwarder::hop(&*$self)))
    };
}

pub(crate) use forward;
