//! What capexec says to a command line shaped by ssh, scp and kill: the
//! port as `-p`, `user@host`, a host as a positional argument, scp's
//! `host:path`, `kill -9`; and "did you mean" for a server's name. Each
//! hint names what capexec takes instead, so the next try works.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

/// A name from `candidates` close to `typed` (a typo: one edit in a short
/// name, a third of the letters in a longer one; never a name as far from
/// it as it is long).
pub fn did_you_mean<'a>(typed: &str, candidates: &[&'a str]) -> Option<&'a str> {
    candidates
        .iter()
        .filter(|candidate| **candidate != typed)
        .map(|candidate| (strsim::damerau_levenshtein(typed, candidate), *candidate))
        .filter(|(distance, candidate)| {
            let longer = typed.chars().count().max(candidate.chars().count());
            *distance <= (longer / 3).max(1) && *distance < typed.chars().count()
        })
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

/// The unknown option `arg` of `subcommand`, as ssh or kill take it: what
/// to write instead (the problem, without "(see --help)").
pub fn unknown_option(arg: &str, subcommand: Option<&str>) -> Option<String> {
    let port = arg == "-p" || arg.strip_prefix("-p").is_some_and(all_digits);
    match subcommand {
        Some("serve") if port => Some(format!(
            "unknown option {arg}: the port goes in the address, --listen tcp:HOST:PORT"
        )),
        Some("cp") => None,
        Some(_) if port => Some(format!(
            "unknown option {arg}: the port goes in the address, --connect tcp:HOST:PORT (or \
             HOST:PORT)"
        )),
        Some("kill") if is_kill_signal(arg) => Some(format!(
            "unknown option {arg}: capexec kill takes no signal: it sends SIGTERM to each \
             process's group, then SIGKILL to what is left after a grace (capexec kill PID)"
        )),
        _ => None,
    }
}

/// `-9`, `-KILL`, `-SIGKILL`, `-s`, `-TERM`...: a signal as kill(1) takes
/// it (clap reports a cluster of short options by its first, `-S`).
fn is_kill_signal(arg: &str) -> bool {
    let Some(name) = arg.strip_prefix('-') else {
        return false;
    };
    all_digits(name)
        || name == "s"
        || name == "n"
        || name.bytes().next().is_some_and(|b| b.is_ascii_uppercase())
}

fn all_digits(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// `capexec shell HOST` (ssh's positional host): the flag that takes it.
pub fn positional_host(arg: &str, subcommand: Option<&str>) -> Option<String> {
    if subcommand != Some("shell") || arg.starts_with('-') {
        return None;
    }
    let host = without_user(arg);
    Some(format!(
        "unexpected argument {arg:?}: capexec shell takes the server as --connect {host}{}",
        users_note(arg)
    ))
}

/// A command that names a server, as `ssh HOST` does: how to reach it.
pub fn server_as_command(name: &str) -> Option<String> {
    let host = without_user(name);
    let named = crate::cli::config::Config::load()
        .ok()
        .is_some_and(|config| config.get(host).is_some());
    (named || name.contains('@')).then(|| {
        format!(
            "unknown command {name:?}: to reach the server {host}, capexec shell --connect \
             {host}, or capexec run --connect {host} -- PROGRAM{}",
            users_note(name)
        )
    })
}

/// `--connect user@host`: capexec has no users to log in as.
pub fn user_at_host(text: &str, given: &str) -> Option<String> {
    if text.starts_with("unix:") || text.contains('/') || !text.contains('@') {
        return None;
    }
    let host = without_user(text.strip_prefix("tcp:").unwrap_or(text));
    Some(format!(
        "{given} {text:?}: capexec has no users to log in as: a command runs as the user that \
         runs the server (start one as that user); write --connect {host}"
    ))
}

/// A program not found that is a server's name (`capexec run build make`).
pub fn server_as_program(program: &OsStr) -> Option<String> {
    let program = program.to_str()?;
    if program.contains('/') {
        return None;
    }
    let host = without_user(program);
    let named = crate::cli::config::Config::load()
        .ok()
        .is_some_and(|config| config.get(host).is_some());
    (named || program.contains('@'))
        .then(|| format!("(to run on the server {host}: capexec run --connect {host} -- PROGRAM)"))
}

/// `cp host:path dst` (scp's form), when no path is remote: the command
/// capexec takes.
pub fn scp_paths(paths: &[std::ffi::OsString]) -> Option<String> {
    let (host, _) = paths.iter().find_map(|path| scp_path(path))?;
    let rewritten: Vec<String> = paths
        .iter()
        .map(|path| match scp_path(path) {
            Some((_, remote)) => quoted(&format!(":{remote}")),
            None => quoted(&path.to_string_lossy()),
        })
        .collect();
    let scp = paths
        .iter()
        .find(|path| scp_path(path).is_some())
        .map(|path| path.to_string_lossy().into_owned())
        .unwrap_or_default();
    Some(format!(
        "{scp:?} is scp's HOST:PATH: capexec names the server with --connect and writes remote \
         paths :PATH (capexec cp --connect {host} {})",
        rewritten.join(" ")
    ))
}

/// HOST and PATH of scp's `[user@]HOST:PATH`: a colon before any slash,
/// after a host name's characters.
fn scp_path(path: &OsStr) -> Option<(String, String)> {
    let text = std::str::from_utf8(path.as_bytes()).ok()?;
    let (host, remote) = text.split_once(':')?;
    let host_like = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-@".contains(&b));
    host_like.then(|| (without_user(host).to_string(), remote.to_string()))
}

fn without_user(text: &str) -> &str {
    text.rsplit_once('@').map_or(text, |(_, host)| host)
}

fn users_note(text: &str) -> &'static str {
    if text.contains('@') {
        " (capexec has no users to log in as: a command runs as the user that runs the server)"
    } else {
        ""
    }
}

/// `text` as a shell word.
fn quoted(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+,:@%".contains(&b));
    if plain {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_are_matched_and_strangers_are_not() {
        let names = ["build", "box", "gpu-west", "local"];
        assert_eq!(did_you_mean("biuld", &names), Some("build"));
        assert_eq!(did_you_mean("bild", &names), Some("build"));
        assert_eq!(did_you_mean("bx", &names), Some("box"));
        assert_eq!(did_you_mean("lokal", &names), Some("local"));
        assert_eq!(did_you_mean("gpu-wset", &names), Some("gpu-west"));
        assert_eq!(did_you_mean("a", &names), None);
        assert_eq!(did_you_mean("nothing-like-it", &names), None);
    }

    #[test]
    fn ssh_and_kill_habits_get_what_capexec_takes() {
        assert!(unknown_option("-p", Some("run")).is_some_and(|h| h.contains("tcp:HOST:PORT")));
        assert!(unknown_option("-p2222", Some("shell")).is_some());
        assert_eq!(unknown_option("-p", Some("cp")), None);
        assert!(unknown_option("-p", Some("serve")).is_some_and(|h| h.contains("--listen")));
        for signal in ["-9", "-KILL", "-SIGKILL", "-s", "-TERM"] {
            assert!(unknown_option(signal, Some("kill")).is_some(), "{signal}");
        }
        assert_eq!(unknown_option("-x", Some("kill")), None);
        assert_eq!(
            user_at_host("root@build:7000", "--connect").as_deref(),
            Some(
                "--connect \"root@build:7000\": capexec has no users to log in as: a command \
                 runs as the user that runs the server (start one as that user); write \
                 --connect build:7000"
            )
        );
        assert_eq!(user_at_host("/run/a@b.sock", "--connect"), None);
        assert_eq!(
            scp_paths(&["build:/etc/hosts".into(), "my dir".into()]).as_deref(),
            Some(
                "\"build:/etc/hosts\" is scp's HOST:PATH: capexec names the server with \
                 --connect and writes remote paths :PATH (capexec cp --connect build \
                 :/etc/hosts 'my dir')"
            )
        );
        assert_eq!(scp_paths(&["./a:b".into(), "c".into()]), None);
    }
}
