//! What a connection's guard and its gatekeeper share: whether the peer
//! has logged in (the guard's limits change then), and why the server is
//! closing the connection.
//!
//! Closing goes through the guard, not capnp-rpc's `Disconnector`: the
//! guard's receive fails with the reason, so capnp-rpc sends the peer an
//! `Abort` that carries it and every call the peer is waiting for fails
//! with it (a `Disconnector` would tell the peer "client requested
//! disconnect", which is false).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::rc::Rc;
use std::task::{Poll, Waker};

use crate::net::pending::Place;

pub(crate) struct Session {
    logged_in: Cell<bool>,
    refusals: Cell<u32>,
    close_reason: RefCell<Option<capnp::Error>>,
    /// The connection's place among those that have not logged in; given
    /// back at login.
    place: RefCell<Option<Place>>,
    /// Bumped on every change, so a waiter never misses one.
    generation: Cell<u64>,
    /// The receive loop, the only one that waits.
    waker: RefCell<Option<Waker>>,
}

impl Session {
    /// A connection that needs no login: a Unix socket (its file
    /// permissions are the authentication), or the client side.
    pub fn logged_in() -> Rc<Session> {
        Rc::new(Session::new(true, None))
    }

    /// A TCP connection, holding `place` until it logs in.
    pub fn awaiting_login(place: Option<Place>) -> Rc<Session> {
        Rc::new(Session::new(false, place))
    }

    fn new(logged_in: bool, place: Option<Place>) -> Session {
        Session {
            logged_in: Cell::new(logged_in),
            refusals: Cell::new(0),
            close_reason: RefCell::new(None),
            place: RefCell::new(place),
            generation: Cell::new(0),
            waker: RefCell::new(None),
        }
    }

    pub fn is_logged_in(&self) -> bool {
        self.logged_in.get()
    }

    pub fn log_in(&self) {
        self.logged_in.set(true);
        self.place.borrow_mut().take();
        self.changed();
    }

    /// Counts a refused login; returns how many there were.
    pub fn refused(&self) -> u32 {
        let refusals = self.refusals.get() + 1;
        self.refusals.set(refusals);
        refusals
    }

    pub fn refusals(&self) -> u32 {
        self.refusals.get()
    }

    /// Closes the connection with `reason` (the first reason given wins).
    pub fn close(&self, reason: capnp::Error) {
        {
            let mut slot = self.close_reason.borrow_mut();
            if slot.is_some() {
                return;
            }
            *slot = Some(reason);
        }
        self.changed();
    }

    pub fn close_reason(&self) -> Option<capnp::Error> {
        self.close_reason.borrow().clone()
    }

    /// Wakes the receive loop to look again (login, close, an answered
    /// login).
    pub fn changed(&self) {
        self.generation.set(self.generation.get() + 1);
        if let Some(waker) = self.waker.borrow_mut().take() {
            waker.wake();
        }
    }

    /// Completes at the next [`Session::changed`].
    pub fn next_change(&self) -> impl Future<Output = ()> + '_ {
        let seen = self.generation.get();
        std::future::poll_fn(move |cx| {
            if self.generation.get() != seen {
                return Poll::Ready(());
            }
            *self.waker.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        })
    }

    /// Completes with the reason once the connection is to be closed.
    pub async fn closing(&self) -> capnp::Error {
        loop {
            if let Some(reason) = self.close_reason() {
                return reason;
            }
            self.next_change().await;
        }
    }
}
