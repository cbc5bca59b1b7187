//! Signals on the wire, by name (generated from the model's one table).

use crate::capexec_capnp as wire;
use crate::model::{Signal, signal_table};

macro_rules! wire_signals {
    ($($variant:ident => $number:ident, $name:literal;)*) => {
        pub fn signal_to_wire(signal: Signal) -> wire::Signal {
            match signal {
                $(Signal::$variant => wire::Signal::$variant,)*
            }
        }

        /// `None` for `unknown`.
        pub fn signal_from_wire(signal: wire::Signal) -> Option<Signal> {
            match signal {
                wire::Signal::Unknown => None,
                $(wire::Signal::$variant => Some(Signal::$variant),)*
            }
        }
    };
}
signal_table!(wire_signals);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_signal_round_trips_by_name() {
        for &signal in Signal::ALL {
            assert_eq!(signal_from_wire(signal_to_wire(signal)), Some(signal));
        }
        assert_eq!(signal_from_wire(wire::Signal::Unknown), None);
    }
}
