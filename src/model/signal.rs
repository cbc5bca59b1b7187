//! The POSIX signals capexec can send and report, by name, so that a client
//! and a server whose operating systems number them differently agree.

use std::fmt;
use std::str::FromStr;

/// The signal table, written once: each signal's variant (the same name
/// as in the schema's `Signal` enum), this host's number for it and its
/// conventional name. `signal_table!(m)` calls the macro `m` with the
/// whole table, so that every mapping (numbers, names, the wire) is
/// generated from these rows.
macro_rules! signal_table {
    ($callback:ident) => {
        $callback! {
            Hup => SIGHUP, "HUP";
            Int => SIGINT, "INT";
            Quit => SIGQUIT, "QUIT";
            Ill => SIGILL, "ILL";
            Trap => SIGTRAP, "TRAP";
            Abrt => SIGABRT, "ABRT";
            Bus => SIGBUS, "BUS";
            Fpe => SIGFPE, "FPE";
            Kill => SIGKILL, "KILL";
            Usr1 => SIGUSR1, "USR1";
            Segv => SIGSEGV, "SEGV";
            Usr2 => SIGUSR2, "USR2";
            Pipe => SIGPIPE, "PIPE";
            Alrm => SIGALRM, "ALRM";
            Term => SIGTERM, "TERM";
            Chld => SIGCHLD, "CHLD";
            Cont => SIGCONT, "CONT";
            Stop => SIGSTOP, "STOP";
            Tstp => SIGTSTP, "TSTP";
            Ttin => SIGTTIN, "TTIN";
            Ttou => SIGTTOU, "TTOU";
            Urg => SIGURG, "URG";
            Xcpu => SIGXCPU, "XCPU";
            Xfsz => SIGXFSZ, "XFSZ";
            Vtalrm => SIGVTALRM, "VTALRM";
            Prof => SIGPROF, "PROF";
            Winch => SIGWINCH, "WINCH";
            Io => SIGIO, "IO";
            Sys => SIGSYS, "SYS";
        }
    };
}
pub(crate) use signal_table;

macro_rules! define_signals {
    ($($variant:ident => $number:ident, $name:literal;)*) => {
        /// A signal with a name (see the module documentation).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        pub enum Signal {
            $($variant,)*
        }

        impl Signal {
            /// Every named signal, in the schema's order.
            pub const ALL: &'static [Signal] = &[$(Signal::$variant,)*];

            /// The number this host's operating system uses for the signal.
            pub fn number(self) -> i32 {
                match self {
                    $(Signal::$variant => libc::$number,)*
                }
            }

            /// The conventional name without the `SIG` prefix, e.g. `INT`.
            pub fn name(self) -> &'static str {
                match self {
                    $(Signal::$variant => $name,)*
                }
            }
        }
    };
}
signal_table!(define_signals);

impl Signal {
    /// The named signal this host numbers `number`, if any.
    pub fn from_number(number: i32) -> Option<Signal> {
        Signal::ALL.iter().copied().find(|s| s.number() == number)
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SIG{}", self.name())
    }
}

impl FromStr for Signal {
    type Err = String;

    /// Accepts `INT`, `SIGINT`, `int` or a number of this host (`2`).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if let Ok(number) = text.parse::<i32>() {
            return Signal::from_number(number)
                .ok_or_else(|| format!("unknown signal number {number}"));
        }
        let upper = text.to_ascii_uppercase();
        let name = upper.strip_prefix("SIG").unwrap_or(&upper);
        Signal::ALL
            .iter()
            .copied()
            .find(|s| s.name() == name)
            .ok_or_else(|| format!("unknown signal {text:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_names_and_numbers_round_trip() {
        for &signal in Signal::ALL {
            assert_eq!(Signal::from_number(signal.number()), Some(signal));
            assert_eq!(signal.name().parse::<Signal>(), Ok(signal));
            assert_eq!(format!("{signal}").parse::<Signal>(), Ok(signal));
        }
        assert_eq!(Signal::ALL.len(), 29);
        assert_eq!("int".parse::<Signal>(), Ok(Signal::Int));
        assert_eq!("9".parse::<Signal>(), Ok(Signal::Kill));
        assert!("NOPE".parse::<Signal>().is_err());
    }
}
