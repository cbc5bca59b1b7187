//! Files a user names to capexec that are not what they should be: a
//! FIFO, a device, a huge configuration. Each gives an error naming the
//! file and what it is, at once, never a hang.

use crate::common;

use std::io::Write;
use std::path::Path;

use common::cli::{Served, capexec, finish, text};
use common::data::TempDir;

fn mkfifo(path: &Path) {
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
}

#[test]
fn a_token_file_that_is_a_fifo_stops_serve_at_once() {
    let dir = TempDir::new("fifo-token");
    let token = dir.path().join("token");
    mkfifo(&token);
    let mut command = capexec(&["serve", "--listen", "tcp:127.0.0.1:0", "--token-file"]);
    command.arg(&token).env("HOME", dir.path());
    let refused = finish(command, None);
    assert_eq!(
        (refused.code, text(&refused.stderr)),
        (
            125,
            format!(
                "capexec: cannot read token file {}: it is a FIFO (named pipe), not a regular \
                 file\n",
                token.display()
            )
        )
    );
}

/// `capexec servers` and `capexec run --connect NAME` with `config.toml`
/// replaced by `make` (a FIFO, a link to a device).
fn with_config(make: impl Fn(&Path), what: &str) {
    let home = TempDir::new("odd-config");
    let dir = home.path().join(".config").join("capexec");
    std::fs::create_dir_all(&dir).expect("config dir");
    let config = dir.join("config.toml");
    make(&config);
    let expected = format!(
        "capexec: {}: it is {what}, not a regular file\n",
        config.display()
    );
    for args in [
        &["servers"][..],
        &["run", "--connect", "build", "--", "true"][..],
    ] {
        let mut command = capexec(args);
        command
            .env("HOME", home.path())
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("CAPEXEC_CONNECT");
        let refused = finish(command, None);
        assert_eq!(
            (refused.code, text(&refused.stderr)),
            (125, expected.clone()),
            "{args:?}"
        );
    }
}

#[test]
fn a_configuration_that_is_a_fifo_is_refused_at_once() {
    with_config(mkfifo, "a FIFO (named pipe)");
}

#[test]
fn a_configuration_that_is_a_device_is_refused_at_once() {
    with_config(
        |config| std::os::unix::fs::symlink("/dev/zero", config).expect("symlink"),
        "a character device",
    );
}

/// 20,000 servers: the file is read in one pass (it took 27 s when each
/// server's line was found by reading the file from its start), and the
/// last of them is the one `--connect` reaches.
#[test]
fn a_configuration_of_twenty_thousand_servers_is_read_whole() {
    let served = Served::start();
    let dir = served.home.path().join(".config").join("capexec");
    std::fs::create_dir_all(&dir).expect("config dir");
    let mut config = std::io::BufWriter::new(
        std::fs::File::create(dir.join("config.toml")).expect("config.toml"),
    );
    for index in 0..19_999 {
        writeln!(
            config,
            "[servers.s{index:05}]\naddress = \"unix:/nonexistent/{index}.sock\"\n"
        )
        .expect("write");
    }
    writeln!(
        config,
        "[servers.s19999]\naddress = \"{}\"\nenvironment = \"local\"",
        served.unix
    )
    .expect("write");
    config.into_inner().expect("flush");
    let ran = finish(
        served.run(&["--connect", "s19999", "-n", "--", "echo", "reached"]),
        None,
    );
    assert_eq!(
        (ran.code, text(&ran.stdout), text(&ran.stderr)),
        (0, "reached\n".to_string(), String::new())
    );
    let listed = finish(served.command("servers", &[]), None);
    let stdout = text(&listed.stdout);
    assert_eq!(listed.code, 0, "{}", text(&listed.stderr));
    assert_eq!(
        stdout.lines().count(),
        1 + 20_000 + 1,
        "a header, the servers, local"
    );
    assert!(
        stdout.lines().nth(20_000).is_some_and(|line| {
            line.split_whitespace().collect::<Vec<_>>() == ["s19999", &served.unix, "-", "local"]
        }),
        "{:?}",
        stdout.lines().nth(20_000)
    );
}
