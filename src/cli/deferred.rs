//! Subcommand arguments defined only when clap enters that subcommand.
//!
//! Deriving builds the definition of every argument of every subcommand
//! before parsing starts: about 0.6 ms of CPU and 80 page faults on every
//! start (`capexec servers`, which does little else, took 1.5 ms against
//! 0.9 ms for a bare `--version`). Wrapped in [`Deferred`], a subcommand's
//! arguments are defined when it is the one being parsed, or when help,
//! completions or man pages need them all (clap builds deferred
//! definitions then).

use clap::{ArgMatches, Args, Command, FromArgMatches};

/// The arguments `T` of one subcommand, defined lazily.
#[derive(Debug)]
pub struct Deferred<T>(pub T);

impl<T: FromArgMatches> FromArgMatches for Deferred<T> {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        T::from_arg_matches(matches).map(Deferred)
    }

    fn from_arg_matches_mut(matches: &mut ArgMatches) -> Result<Self, clap::Error> {
        T::from_arg_matches_mut(matches).map(Deferred)
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches(matches)
    }

    fn update_from_arg_matches_mut(&mut self, matches: &mut ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches_mut(matches)
    }
}

impl<T: Args> Args for Deferred<T> {
    fn group_id() -> Option<clap::Id> {
        T::group_id()
    }

    fn augment_args(command: Command) -> Command {
        command.defer(|command| keep_texts(command, T::augment_args))
    }

    fn augment_args_for_update(command: Command) -> Command {
        command.defer(|command| keep_texts(command, T::augment_args_for_update))
    }
}

/// Defines the arguments with `augment`, keeping the texts the subcommand
/// was given: a documented struct of arguments sets its own, which the
/// subcommand's used to replace afterwards and now would not. (A
/// subcommand whose only text is its struct's must not be deferred: the
/// list of subcommands shows texts without building anything.)
fn keep_texts(command: Command, augment: fn(Command) -> Command) -> Command {
    let about = command.get_about().cloned();
    let long_about = command.get_long_about().cloned();
    let command = augment(command);
    let Some(about) = about else {
        return command;
    };
    let command = command.about(about);
    match long_about {
        Some(text) => command.long_about(text),
        None => command.long_about(None::<&str>),
    }
}
