//! Argument errors as one line in capexec's style, instead of clap's
//! multi-line blocks (whose tips, such as "use '-- -i'", can be wrong for a
//! command that takes a program after `--`).

use clap::error::{ContextKind, ContextValue, ErrorKind};

/// One line (without the `capexec: ` prefix) saying what is wrong with the
/// arguments, and where to read more.
pub fn one_line(error: &clap::Error, subcommand: Option<&str>) -> String {
    let text = |kind| context_text(error, kind);
    let flag = || text(ContextKind::InvalidArg).map(|arg| flag_name(&arg));
    let problem = match error.kind() {
        ErrorKind::UnknownArgument => {
            let arg = text(ContextKind::InvalidArg).unwrap_or_default();
            let habit = crate::cli::habits::unknown_option(&arg, subcommand)
                .or_else(|| crate::cli::habits::positional_host(&arg, subcommand));
            if let Some(hint) = habit {
                return with_help(hint, subcommand);
            }
            let mut line = if arg.starts_with('-') {
                format!("unknown option {arg}")
            } else {
                format!("unexpected argument {arg:?}")
            };
            if let Some(suggested) = text(ContextKind::SuggestedArg) {
                line.push_str(&format!(" (did you mean {}?)", flag_name(&suggested)));
            }
            line
        }
        ErrorKind::InvalidSubcommand => {
            let name = text(ContextKind::InvalidSubcommand).unwrap_or_default();
            match text(ContextKind::SuggestedSubcommand) {
                Some(suggested) => format!("unknown command {name:?} (did you mean {suggested}?)"),
                None => match crate::cli::habits::server_as_command(&name) {
                    Some(hint) => hint,
                    None => format!("unknown command {name:?}"),
                },
            }
        }
        ErrorKind::ValueValidation => {
            let flag = flag().unwrap_or_default();
            match std::error::Error::source(error) {
                Some(reason) => format!("{flag} {reason}"),
                None => format!("{flag}: invalid value"),
            }
        }
        ErrorKind::InvalidValue => {
            let flag = flag().unwrap_or_default();
            match text(ContextKind::InvalidValue) {
                Some(value) if !value.is_empty() => format!("{flag}: invalid value {value:?}"),
                _ => format!("{flag} needs a value"),
            }
        }
        ErrorKind::MissingRequiredArgument => {
            let missing = text(ContextKind::InvalidArg).unwrap_or_default();
            format!("missing {missing}")
        }
        ErrorKind::ArgumentConflict => {
            let first = flag().unwrap_or_default();
            match text(ContextKind::PriorArg) {
                Some(prior) => format!("{first} cannot be used with {}", flag_name(&prior)),
                None => format!("{first} cannot be used with the other options given"),
            }
        }
        ErrorKind::NoEquals
        | ErrorKind::TooManyValues
        | ErrorKind::TooFewValues
        | ErrorKind::WrongNumberOfValues => {
            format!("{}: wrong number of values", flag().unwrap_or_default())
        }
        ErrorKind::MissingSubcommand | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            return "give a command, such as run, shell, serve, servers or info (see capexec \
                    --help)"
                .to_string();
        }
        _ => first_line(error),
    };
    with_help(problem, subcommand)
}

/// `problem`, then where to read more.
fn with_help(problem: String, subcommand: Option<&str>) -> String {
    match subcommand {
        Some(name) => format!("{problem} (see capexec {name} --help)"),
        None => format!("{problem} (see capexec --help)"),
    }
}

/// `--timeout <SECS>` as `--timeout`; `<PROGRAM>...` as `PROGRAM`.
fn flag_name(arg: &str) -> String {
    let name = arg.split([' ', '=']).next().unwrap_or(arg);
    if name.starts_with('-') {
        name.to_string()
    } else {
        arg.trim_matches(|c| c == '<' || c == '>' || c == '.')
            .to_string()
    }
}

fn context_text(error: &clap::Error, kind: ContextKind) -> Option<String> {
    match error.get(kind)? {
        ContextValue::String(text) => Some(text.clone()),
        ContextValue::Strings(texts) => Some(
            texts
                .iter()
                .map(|text| flag_name(text))
                .collect::<Vec<_>>()
                .join(", "),
        ),
        ContextValue::StyledStr(text) => Some(text.to_string()),
        ContextValue::StyledStrs(texts) => Some(
            texts
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        ),
        ContextValue::Number(number) => Some(number.to_string()),
        _ => None,
    }
}

/// clap's own first line, without its `error: ` label.
fn first_line(error: &clap::Error) -> String {
    let rendered = error.render().to_string();
    let line = rendered.lines().next().unwrap_or("invalid arguments");
    line.trim_start_matches("error:").trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, Command};

    fn error_of(args: &[&str]) -> clap::Error {
        Command::new("capexec")
            .subcommand(
                Command::new("run")
                    .arg(Arg::new("env").long("env").short('e'))
                    .arg(
                        Arg::new("timeout")
                            .long("timeout")
                            .value_name("SECS")
                            .value_parser(|text: &str| crate::cli::duration::parse(text)),
                    )
                    .arg(Arg::new("program").num_args(1..).required(true)),
            )
            .try_get_matches_from(args)
            .expect_err("an argument error")
    }

    #[test]
    fn argument_errors_are_one_line() {
        assert_eq!(
            one_line(
                &error_of(&["capexec", "run", "--envv", "x", "--", "true"]),
                Some("run")
            ),
            "unknown option --envv (did you mean --env?) (see capexec run --help)"
        );
        assert_eq!(
            one_line(
                &error_of(&["capexec", "run", "--timeout", "soon", "true"]),
                Some("run")
            ),
            "--timeout expects a duration such as 10, 0.5, 90s, 5m or 1h, got \"soon\" \
             (see capexec run --help)"
        );
        assert_eq!(
            one_line(&error_of(&["capexec", "run"]), Some("run")),
            "missing program (see capexec run --help)"
        );
        assert_eq!(
            one_line(&error_of(&["capexec", "rum"]), None),
            "unknown command \"rum\" (did you mean run?) (see capexec --help)"
        );
    }
}
