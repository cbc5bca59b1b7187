//! `capexec serve --upstream`, `capexec run --environment`, `capexec
//! environments` and `capexec info`, end to end.

use crate::common;

use common::cli::{Served, capexec, finish, text};
use common::data::TempDir;

#[test]
fn environments_can_be_listed_chosen_and_fail_clearly() {
    let far = Served::start();
    let nowhere = TempDir::new("nowhere");
    let missing = format!("unix:{}", nowhere.path().join("missing.sock").display());
    let far_token = format!("c={}", far.token_arg());
    let upstream_c = format!("c={}", far.tcp);
    let upstream_gone = format!("gone={missing}");
    let front = Served::start_with(&[
        "--upstream",
        &upstream_c,
        "--upstream-token-file",
        &far_token,
        "--upstream",
        &upstream_gone,
        "--default",
        "c",
    ]);

    let listed = finish(
        front.command("environments", &["--connect", &front.unix]),
        None,
    );
    assert_eq!(listed.code, 0, "{}", text(&listed.stderr));
    assert_eq!(
        text(&listed.stdout),
        format!(
            "  local  local\n\
             * c      idle        {}\n\
             \x20 gone   idle        {missing}\n",
            far.tcp
        )
    );

    // The default environment is C: the process runs there.
    let remote = finish(
        front.run(&[
            "--connect",
            &front.unix,
            "-n",
            "--",
            "sh",
            "-c",
            "echo hi; exit 4",
        ]),
        None,
    );
    assert_eq!((remote.code, text(&remote.stdout)), (4, "hi\n".to_string()));
    let info = finish(
        front.command("info", &["--connect", &front.unix, "--environment", "c"]),
        None,
    );
    assert_eq!(info.code, 0, "{}", text(&info.stderr));
    assert!(text(&info.stdout).starts_with("environment: c\nversion: "));

    let local = finish(
        front.run(&[
            "--connect",
            &front.unix,
            "--environment",
            "local",
            "-n",
            "--",
            "echo",
            "here",
        ]),
        None,
    );
    assert_eq!((local.code, text(&local.stdout)), (0, "here\n".to_string()));

    let gone = finish(
        front.run(&[
            "--connect",
            &front.unix,
            "--environment",
            "gone",
            "-n",
            "--",
            "true",
        ]),
        None,
    );
    assert_eq!(gone.code, 125);
    let missing_path = missing.trim_start_matches("unix:");
    assert_eq!(
        text(&gone.stderr),
        format!(
            "capexec: upstream \"gone\" ({missing}) is unavailable: cannot connect to \
             unix:{missing_path}: No such file or directory\n"
        )
    );
    let unknown = finish(
        front.run(&[
            "--connect",
            &front.unix,
            "--environment",
            "nope",
            "-n",
            "--",
            "true",
        ]),
        None,
    );
    assert_eq!(unknown.code, 125);
    assert_eq!(
        text(&unknown.stderr),
        "capexec: --environment nope: the server has no environment named \"nope\" (it has: \
         local, c, gone)\n"
    );
    // A name missing further down the path: the hop that lacks it says
    // what it has.
    let unknown_far = finish(
        front.run(&[
            "--connect",
            &front.unix,
            "--environment",
            "c/nope",
            "-n",
            "--",
            "true",
        ]),
        None,
    );
    assert_eq!(unknown_far.code, 125);
    assert_eq!(
        text(&unknown_far.stderr),
        "capexec: --environment c/nope: environment \"c\" has no environment named \"nope\" \
         (it has: local)\n"
    );

    let listed = finish(
        front.command("environments", &["--connect", &front.unix]),
        None,
    );
    let listed = text(&listed.stdout);
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(lines[1], format!("* c      connected   {}", far.tcp));
    assert!(
        lines[2].starts_with(&format!(
            "  gone   failed      {missing}  (cannot connect to {missing}: No such file or directory; next attempt in "
        )),
        "{}",
        lines[2]
    );
}

#[test]
fn bad_upstream_flags_are_refused_before_serving() {
    let cases: [(&[&str], &str); 6] = [
        (
            &["--upstream", "b=tcp:127.0.0.1:1"],
            "capexec: --upstream b (tcp:127.0.0.1:1) needs a login token: give --upstream-token-file b=FILE\n",
        ),
        (
            &["--upstream", "b=unix:/x", "--upstream-token-file", "b=/y"],
            "capexec: --upstream-token-file b: unix:/x needs no token (a Unix socket is protected by its file permissions)\n",
        ),
        (
            &["--upstream", "b"],
            "capexec: --upstream expects NAME=ADDR, got \"b\"\n",
        ),
        (
            &["--upstream", "local=unix:/x"],
            "capexec: invalid environment name \"local\": use letters, digits, '-', '_' and '.', and not \"local\"\n",
        ),
        (
            &["--default", "b"],
            "capexec: the default environment \"b\" is not defined\n",
        ),
        (
            &["--upstream-token-file", "b=/x"],
            "capexec: --upstream-token-file b: no --upstream b=ADDR\n",
        ),
    ];
    let dir = TempDir::new("bad-upstream");
    for (args, message) in cases {
        let socket = format!("unix:{}", dir.path().join("s.sock").display());
        let mut command = capexec(&["serve", "--listen", &socket]);
        command.args(args).env("HOME", dir.path());
        let refused = finish(command, None);
        assert_eq!(
            (refused.code, text(&refused.stderr)),
            (125, message.to_string()),
            "{args:?}"
        );
    }
}

#[test]
fn the_embedded_executor_has_only_the_local_environment() {
    let listed = finish(capexec(&["environments"]), None);
    assert_eq!(
        (listed.code, text(&listed.stdout)),
        (0, "* local  local\n".to_string())
    );
    let unknown = finish(
        capexec(&["run", "--environment", "far", "-n", "--", "true"]),
        None,
    );
    assert_eq!(unknown.code, 125);
    assert_eq!(
        text(&unknown.stderr),
        "capexec: --environment far: the embedded executor has no environment named \"far\" \
         (it has: local)\n"
    );
}
