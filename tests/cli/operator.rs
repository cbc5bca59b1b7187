//! The operator's first hour: named servers, `CAPEXEC_CONNECT`, the
//! default socket, trust on first use, self-signed and openssl-made
//! certificates, completions, man pages and `--version`.

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::cli::{BIN, Served, finish, spawn_until_first_line, text};
use common::data::TempDir;

/// `capexec SUBCOMMAND ARGS` with its configuration in `config` (as
/// `$XDG_CONFIG_HOME/capexec`) and no default token or server.
fn configured(config: &Path, subcommand: &str, args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command
        .arg(subcommand)
        .args(args)
        .env("XDG_CONFIG_HOME", config)
        .env("HOME", config)
        .env_remove("CAPEXEC_TOKEN")
        .env_remove("CAPEXEC_CONNECT");
    command
}

fn write_config(config: &Path, text: &str) -> std::path::PathBuf {
    let dir = config.join("capexec");
    std::fs::create_dir_all(&dir).expect("config dir");
    let file = dir.join("config.toml");
    std::fs::write(&file, text).expect("config");
    file
}

#[test]
fn named_servers_reach_their_address_token_and_environment() {
    let served = Served::start();
    let config = TempDir::new("cli-config");
    write_config(
        config.path(),
        &format!(
            "# servers\n[servers.box]\naddress = \"{}\"\n\n[servers.net]\naddress = \"{}\"\n\
             token-file = \"{}\"\nenvironment = \"local\"\n",
            served.unix,
            served.tcp,
            served.token_arg()
        ),
    );
    for name in ["box", "net"] {
        let ran = finish(
            configured(
                config.path(),
                "run",
                &["--connect", name, "--", "echo", name],
            ),
            None,
        );
        assert_eq!(
            (ran.code, text(&ran.stdout), text(&ran.stderr)),
            (0, format!("{name}\n"), String::new())
        );
    }
    // CAPEXEC_CONNECT is the default server, as DOCKER_HOST is.
    let mut command = configured(config.path(), "run", &["--", "echo", "default"]);
    command.env("CAPEXEC_CONNECT", "net");
    let ran = finish(command, None);
    assert_eq!((ran.code, text(&ran.stdout)), (0, "default\n".to_string()));
    let info = finish(
        configured(config.path(), "info", &["--connect", "net"]),
        None,
    );
    assert_eq!(info.code, 0);
    assert!(
        text(&info.stdout).starts_with("environment: local\n"),
        "{}",
        text(&info.stdout)
    );

    let listed = finish(configured(config.path(), "servers", &[]), None);
    assert_eq!(listed.code, 0);
    let lines: Vec<String> = text(&listed.stdout).lines().map(str::to_string).collect();
    assert!(lines[0].starts_with("NAME"), "{lines:?}");
    assert!(
        lines[1].starts_with("box ") && lines[1].contains(&served.unix),
        "{lines:?}"
    );
    assert!(
        lines[2].starts_with("net ")
            && lines[2].contains(&served.tcp)
            && lines[2].ends_with("local"),
        "{lines:?}"
    );

    let unknown = finish(
        configured(config.path(), "run", &["--connect", "nope", "--", "true"]),
        None,
    );
    let file = config.path().join("capexec/config.toml");
    assert_eq!(
        (unknown.code, text(&unknown.stderr)),
        (
            125,
            format!(
                "capexec: --connect \"nope\": no server of that name in {} (it names box, net); \
                 an address is unix:PATH or tcp:HOST:PORT\n",
                file.display()
            )
        )
    );
}

/// A wrong entry is one line with the file and line, and breaks only its
/// own name: the other servers, and `local`, still work; `servers` lists
/// them and says what is wrong (exit 125). Even text that is not TOML
/// breaks only the table it is in.
#[test]
fn a_wrong_configuration_entry_breaks_only_its_own_name() {
    let served = Served::start();
    let runtime = TempDir::new("cli-config-runtime");
    let mut serve = Command::new(BIN);
    serve
        .args(["serve", "--token-file"])
        .arg(runtime.path().join("token"))
        .env("XDG_RUNTIME_DIR", runtime.path())
        .env("HOME", runtime.path())
        .env_remove("XDG_CONFIG_HOME");
    let (mut local_server, _) = spawn_until_first_line(serve);
    let config = TempDir::new("cli-config-bad");
    let port = served.tcp.rsplit(':').next().expect("port");
    for (broken, line, why) in [
        (
            "[servers.b]\naddress = \"b-box\"\n",
            5,
            "[servers.b]: address \"b-box\": an address is tcp:HOST:PORT, HOST:PORT, unix:PATH \
             or /PATH",
        ),
        ("[servers.b]\naddress = \"unterminated\n", 5, ""),
    ] {
        let file = write_config(
            config.path(),
            &format!(
                "[servers.a]\naddress = \"{}\"\n\n{broken}\n[servers.c]\naddress = \
                 \"127.0.0.1:{port}\"\ntoken-file = \"{}\"\n",
                served.unix,
                served.token_arg()
            ),
        );
        let at = format!("capexec: {}:{line}: {why}", file.display());
        let run = |name: &str| {
            let mut command = configured(
                config.path(),
                "run",
                &["--connect", name, "--", "echo", name],
            );
            command.env("XDG_RUNTIME_DIR", runtime.path());
            finish(command, None)
        };
        let failed = run("b");
        assert_eq!(failed.code, 125, "{broken}");
        let stderr = text(&failed.stderr);
        assert!(
            stderr.starts_with(&at) && stderr.lines().count() == 1,
            "{broken}: {stderr}"
        );
        for name in ["a", "c", "local"] {
            let ran = run(name);
            assert_eq!(
                (ran.code, text(&ran.stdout), text(&ran.stderr)),
                (0, format!("{name}\n"), String::new()),
                "{broken}"
            );
        }
        let mut listing = configured(config.path(), "servers", &[]);
        listing.env("XDG_RUNTIME_DIR", runtime.path());
        let listed = finish(listing, None);
        assert_eq!(
            (listed.code, text(&listed.stderr)),
            (125, stderr.clone()),
            "{broken}"
        );
        let names: Vec<String> = text(&listed.stdout)
            .lines()
            .map(|line| line.split(' ').next().unwrap_or("").to_string())
            .collect();
        assert_eq!(names, ["NAME", "a", "c", "local"], "{broken}");
    }
    let _ = local_server.kill();
    let _ = local_server.wait();
}

#[test]
fn a_configuration_entry_naming_a_missing_file_says_which_line() {
    let config = TempDir::new("cli-config-missing");
    let file = config.path().join("capexec/config.toml");
    // An entry naming a file that is not there: the file and line of the
    // key, then the file's problem.
    let token = config.path().join("capexec").join("c.token");
    write_config(config.path(), "");
    std::fs::write(&token, "t".repeat(64)).expect("token");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    write_config(
        config.path(),
        "[servers.t]\naddress = \"tcp:127.0.0.1:9\"\n\ntoken-file = \"missing.token\"\n\
         [servers.c]\naddress = \"tcp:127.0.0.1:9\"\ntoken-file = \"c.token\"\n\
         tls-ca = \"/nonexistent/ca.pem\"\n",
    );
    let failed = finish(
        configured(config.path(), "run", &["--connect", "t", "--", "true"]),
        None,
    );
    assert_eq!(
        (failed.code, text(&failed.stderr)),
        (
            125,
            format!(
                "capexec: {}:4: [servers.t]: token-file {}: No such file or directory\n",
                file.display(),
                config
                    .path()
                    .join("capexec")
                    .join("missing.token")
                    .display()
            )
        )
    );
    let failed = finish(
        configured(config.path(), "run", &["--connect", "c", "--", "true"]),
        None,
    );
    let stderr = text(&failed.stderr);
    assert_eq!(failed.code, 125);
    assert!(
        stderr.starts_with(&format!(
            "capexec: {}:8: [servers.c]: tls-ca /nonexistent/ca.pem: ",
            file.display()
        )),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn addresses_typed_as_people_type_them_work() {
    let served = Served::start();
    let path = served.socket.display().to_string();
    let port = served.tcp.rsplit(':').next().expect("port").to_string();
    for (connect, token) in [
        (path.as_str(), None),
        (&*format!("127.0.0.1:{port}"), Some(served.token_arg())),
    ] {
        let mut args = vec!["--connect", connect];
        let token_arg;
        if let Some(token) = token {
            token_arg = token;
            args.extend(["--token-file", &token_arg]);
        }
        args.extend(["--", "echo", "typed"]);
        let ran = finish(served.run(&args), None);
        assert_eq!(
            (ran.code, text(&ran.stdout)),
            (0, "typed\n".to_string()),
            "{connect}"
        );
    }
    let bad = finish(served.run(&["--connect", "host:http", "--", "true"]), None);
    assert_eq!(
        (bad.code, text(&bad.stderr)),
        (
            125,
            "capexec: --connect \"host:http\": \"http\" is not a port number; write \
             tcp:HOST:PORT, unix:PATH or the name of a server in the configuration file\n"
                .to_string()
        )
    );
}

#[test]
fn serve_without_listen_uses_the_default_socket_that_local_reaches() {
    let runtime = TempDir::new("cli-runtime");
    let mut serve = Command::new(BIN);
    serve
        .arg("serve")
        .env("XDG_RUNTIME_DIR", runtime.path())
        .env("HOME", runtime.path())
        .env_remove("XDG_CONFIG_HOME");
    let (mut server, line) = spawn_until_first_line(serve);
    let socket = runtime.path().join("capexec/capexec.sock");
    assert_eq!(line, format!("unix:{}\n", socket.display()));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(runtime.path().join("capexec"))
        .expect("socket dir")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
    let mut run = Command::new(BIN);
    run.args(["run", "--connect", "local", "--", "echo", "local"])
        .env("XDG_RUNTIME_DIR", runtime.path())
        .env("HOME", runtime.path())
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("CAPEXEC_CONNECT");
    let ran = finish(run, None);
    assert_eq!((ran.code, text(&ran.stdout)), (0, "local\n".to_string()));
    let _ = server.kill();
    let _ = server.wait();
}

#[test]
fn trust_on_first_use_remembers_and_refuses_a_changed_certificate() {
    let served = Served::start_with(&["--tls-self-signed"]);
    let cert = served.home.path().join(".config/capexec/server-cert.pem");
    let key = served.home.path().join(".config/capexec/server-key.pem");
    use std::os::unix::fs::PermissionsExt;
    let key_mode = std::fs::metadata(&key).expect("key").permissions().mode();
    assert_eq!(key_mode & 0o777, 0o600);
    let fingerprint = capexec::net::TlsServer::certificate_fingerprint(&cert).expect("cert");
    let token = served.token_arg();
    let known = served.home.path().join(".config/capexec/known-servers");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "--connect",
            served.tcp.as_str(),
            "--token-file",
            token.as_str(),
        ];
        args.extend_from_slice(extra);
        args.extend(["--", "echo", "tls"]);
        finish(served.run(&args), None)
    };

    // Not on a terminal: refused, with the fingerprint and what to do.
    let refused = run(&["--tls"]);
    assert_eq!(refused.code, 125);
    assert_eq!(
        text(&refused.stderr),
        format!(
            "capexec: the server at {} offers a TLS certificate that is not known here (SHA-256 \
             {fingerprint}); nothing was sent to it. Compare it with the fingerprint `capexec \
             serve` printed, then connect again with --tls-accept-new to remember it in {} (or \
             give --tls-pin {fingerprint})\n",
            served.tcp,
            known.display()
        )
    );
    assert!(refused.stdout.is_empty());
    assert!(!known.exists());

    let accepted = run(&["--tls-accept-new"]);
    assert_eq!(
        (accepted.code, text(&accepted.stdout)),
        (0, "tls\n".to_string()),
        "{}",
        text(&accepted.stderr)
    );
    assert_eq!(
        text(&accepted.stderr),
        format!(
            "capexec: trusting the TLS certificate of {} (SHA-256 {fingerprint}), remembered in \
             {}\n",
            served.tcp,
            known.display()
        )
    );
    let remembered = std::fs::read_to_string(&known).expect("known-servers");
    assert!(
        remembered.ends_with(&format!("\n{} {fingerprint}\n", served.tcp)),
        "{remembered}"
    );

    // Remembered: no flag needed, nothing asked.
    let again = run(&[]);
    assert_eq!(
        (again.code, text(&again.stdout), text(&again.stderr)),
        (0, "tls\n".to_string(), String::new())
    );

    // A changed certificate is refused loudly, even with --tls-accept-new.
    let other = "ab".repeat(32);
    std::fs::write(&known, format!("# mine\n{} {other}\n", served.tcp)).expect("rewrite");
    for extra in [&[][..], &["--tls-accept-new"]] {
        let changed = run(extra);
        assert_eq!(changed.code, 125);
        assert_eq!(
            text(&changed.stderr),
            format!(
                "capexec: the TLS certificate of {} has CHANGED: it was {other}, it is now \
                 {fingerprint}; nothing was sent to it. Someone may be intercepting the \
                 connection, or the server has a new certificate: if you know it has, delete \
                 line 2 of {} and connect again\n",
                served.tcp,
                known.display()
            )
        );
        assert!(changed.stdout.is_empty());
    }

    // The certificate is kept: another server of the same user serves it.
    let mut again = Command::new(BIN);
    again
        .args([
            "serve",
            "--listen",
            "tcp:127.0.0.1:0",
            "--tls-self-signed",
            "--token-file",
            &token,
        ])
        .env("HOME", served.home.path())
        .env_remove("XDG_CONFIG_HOME");
    let (mut second, line) = spawn_until_first_line(again);
    assert!(line.starts_with("tcp:127.0.0.1:"), "{line}");
    let _ = second.kill();
    let _ = second.wait();
    assert_eq!(
        capexec::net::TlsServer::certificate_fingerprint(&cert).expect("cert"),
        fingerprint
    );
}

#[test]
fn tls_ca_accepts_the_certificate_of_the_openssl_one_liner() {
    let dir = TempDir::new("cli-openssl");
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-days",
            "2",
            "-keyout",
        ])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("openssl is installed");
    assert!(made.success());
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let served = Served::start_with(&["--tls-cert", &cert, "--tls-key", &key]);
    let token = served.token_arg();
    let ran = finish(
        served.run(&[
            "--connect",
            &served.tcp,
            "--token-file",
            &token,
            "--tls-ca",
            &cert,
            "--",
            "echo",
            "ok",
        ]),
        None,
    );
    assert_eq!(
        (ran.code, text(&ran.stdout), text(&ran.stderr)),
        (0, "ok\n".to_string(), String::new())
    );
    // The name is still checked: the certificate is for 127.0.0.1 only.
    let port = served.tcp.rsplit(':').next().expect("port");
    let wrong_name = finish(
        served.run(&[
            "--connect",
            &format!("tcp:localhost:{port}"),
            "--token-file",
            &token,
            "--tls-ca",
            &cert,
            "--",
            "true",
        ]),
        None,
    );
    let stderr = text(&wrong_name.stderr);
    assert_eq!(wrong_name.code, 125);
    assert!(stderr.contains("not valid for"), "{stderr}");
    assert!(
        !stderr.contains("Other(") && !stderr.contains("Context"),
        "{stderr}"
    );
}

#[test]
fn client_config_prints_what_a_new_client_pastes() {
    let served = Served::start_with(&["--tls-self-signed"]);
    let cert = served.home.path().join(".config/capexec/server-cert.pem");
    let fingerprint = capexec::net::TlsServer::certificate_fingerprint(&cert).expect("cert");
    let printed = finish(
        served.command(
            "client-config",
            &[
                "build",
                "--address",
                &served.tcp,
                "--token-file",
                &served.token_arg(),
                "--tls-self-signed",
            ],
        ),
        None,
    );
    assert_eq!(printed.code, 0, "{}", text(&printed.stderr));
    let token = served.token();
    let stdout = text(&printed.stdout);
    let dir = "\"${XDG_CONFIG_HOME:-$HOME/.config}/capexec\"";
    let shell_line = format!(
        "mkdir -p {dir} && (umask 077 && echo '{}' > {dir}/build.token)",
        token.as_str()
    );
    assert_eq!(
        stdout.lines().take(3).collect::<Vec<_>>(),
        [
            "# On the client, save the token (readable only by its user):".to_string(),
            format!("#   {shell_line}"),
            format!("# then add these lines to {dir}/config.toml:"),
        ],
        "{stdout}"
    );
    let lines: String = stdout
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        lines,
        format!(
            "[servers.build]\naddress = \"{}\"\ntoken-file = \"build.token\"\n\
             tls-pin = \"{fingerprint}\"\n",
            served.tcp
        )
    );
    // Pasted on a client, with or without XDG_CONFIG_HOME, it connects.
    for xdg in [false, true] {
        let client = TempDir::new("cli-new-client");
        let config_home = client.path().join("elsewhere");
        let env = |command: &mut Command| {
            command
                .env("HOME", client.path())
                .env_remove("CAPEXEC_TOKEN")
                .env_remove("CAPEXEC_CONNECT");
            if xdg {
                command.env("XDG_CONFIG_HOME", &config_home);
            } else {
                command.env_remove("XDG_CONFIG_HOME");
            }
        };
        let mut paste = Command::new("sh");
        paste.args(["-c", &format!("{shell_line} && cat >> {dir}/config.toml")]);
        env(&mut paste);
        let pasted = finish(paste, Some(lines.clone().into_bytes()));
        assert_eq!(pasted.code, 0, "{}", text(&pasted.stderr));
        let where_ = if xdg {
            config_home.join("capexec/config.toml")
        } else {
            client.path().join(".config/capexec/config.toml")
        };
        assert!(where_.is_file(), "{}", where_.display());
        let mut run = Command::new(BIN);
        run.args(["run", "--connect", "build", "--", "echo", "pasted"]);
        env(&mut run);
        let ran = finish(run, None);
        assert_eq!(
            (ran.code, text(&ran.stdout), text(&ran.stderr)),
            (0, "pasted\n".to_string(), String::new()),
            "XDG_CONFIG_HOME set: {xdg}"
        );
    }
}

/// An empty CAPEXEC_CONNECT is as if unset (the embedded executor), and
/// what is wrong with a set one names the variable, not --connect.
#[test]
fn capexec_connect_empty_is_unset_and_its_errors_name_it() {
    let config = TempDir::new("cli-connect-variable");
    let file = write_config(
        config.path(),
        "[servers.box]\naddress = \"unix:/nonexistent\"\n",
    );
    let with = |value: &str, args: &[&str]| {
        let mut command = configured(config.path(), "run", args);
        command.env("CAPEXEC_CONNECT", value);
        finish(command, None)
    };
    let embedded = with("", &["--", "echo", "embedded"]);
    assert_eq!(
        (
            embedded.code,
            text(&embedded.stdout),
            text(&embedded.stderr)
        ),
        (0, "embedded\n".to_string(), String::new())
    );
    for (value, error) in [
        (
            "nope",
            format!(
                "capexec: CAPEXEC_CONNECT=\"nope\": no server of that name in {} (it names box); \
                 an address is unix:PATH or tcp:HOST:PORT\n",
                file.display()
            ),
        ),
        (
            "host:http",
            "capexec: CAPEXEC_CONNECT=\"host:http\": \"http\" is not a port number; write \
             tcp:HOST:PORT, unix:PATH or the name of a server in the configuration file\n"
                .to_string(),
        ),
    ] {
        let failed = with(value, &["--", "true"]);
        assert_eq!((failed.code, text(&failed.stderr)), (125, error));
    }
    // The flag wins over the variable, and is named as the flag.
    let flagged = with("box", &["--connect", "nope", "--", "true"]);
    assert_eq!(
        (flagged.code, text(&flagged.stderr)),
        (
            125,
            format!(
                "capexec: --connect \"nope\": no server of that name in {} (it names box); an \
                 address is unix:PATH or tcp:HOST:PORT\n",
                file.display()
            )
        )
    );
}

#[test]
fn completions_man_pages_and_version_are_generated() {
    for shell in ["bash", "zsh", "fish"] {
        let script = finish(common::cli::capexec(&["completions", shell]), None);
        assert_eq!(script.code, 0, "{shell}");
        let script = text(&script.stdout);
        for word in ["serve", "servers", "connect", "tls-accept-new"] {
            assert!(script.contains(word), "{shell} lacks {word}");
        }
    }
    let dir = TempDir::new("cli-man");
    let man = finish(
        common::cli::capexec(&["man", "--dir", &dir.path().display().to_string()]),
        None,
    );
    assert_eq!(man.code, 0, "{}", text(&man.stderr));
    for page in [
        "capexec.1",
        "capexec-run.1",
        "capexec-serve.1",
        "capexec-servers.1",
    ] {
        let text = std::fs::read_to_string(dir.path().join(page)).expect(page);
        assert!(text.starts_with(".ie") && text.contains(".TH"), "{page}");
        // The page opens with NAME: nothing but its title before it.
        let lines: Vec<&str> = text.lines().take(4).collect();
        let (name, sub) = match page.strip_prefix("capexec-") {
            Some(sub) => (page.trim_end_matches(".1"), sub.trim_end_matches(".1")),
            None => ("capexec", "capexec"),
        };
        assert_eq!(
            lines[2..],
            [
                format!(".TH {name} 1  \"{sub} {}\" ", env!("CARGO_PKG_VERSION")),
                ".SH NAME".to_string()
            ],
            "{page}"
        );
    }
    let printed = finish(common::cli::capexec(&["man"]), None);
    assert_eq!(printed.code, 0, "{}", text(&printed.stderr));
    assert_eq!(
        text(&printed.stdout).lines().nth(3),
        Some(".SH NAME"),
        "{}",
        text(&printed.stdout)
    );
    let version = finish(common::cli::capexec(&["--version"]), None);
    let stdout = text(&version.stdout);
    assert_eq!(version.code, 0);
    assert!(
        stdout.starts_with(&format!(
            "capexec {}\nfeatures: start ",
            env!("CARGO_PKG_VERSION")
        )),
        "{stdout}"
    );
    assert!(stdout.contains(" detach "), "{stdout}");
    // The short form answers the same, and so does clap's own path (taken
    // when --version is not the only argument).
    let short = finish(common::cli::capexec(&["-V"]), None);
    assert_eq!((short.code, text(&short.stdout)), (0, stdout.clone()));
    let through_clap = finish(common::cli::capexec(&["--version", "extra"]), None);
    assert_eq!(
        (through_clap.code, text(&through_clap.stdout)),
        (0, stdout.clone())
    );
    // A version that cannot be written is not a success.
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let mut lost = common::cli::capexec(&["--version"])
        .stdin(std::process::Stdio::null())
        .stdout(full)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("capexec --version");
    let code = common::cli::wait(&mut lost);
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut lost.stderr.take().expect("stderr"), &mut stderr)
        .expect("stderr");
    assert_eq!(
        (code, stderr.as_str()),
        (
            125,
            "capexec: cannot write the version: No space left on device\n"
        )
    );
    let overview = text(&finish(common::cli::capexec(&["--help"]), None).stdout);
    for subcommand in [
        "run",
        "shell",
        "serve",
        "environments",
        "info",
        "servers",
        "client-config",
        "completions",
        "man",
        "ps",
        "kill",
        "cp",
        "forward",
    ] {
        let help = finish(common::cli::capexec(&[subcommand, "--help"]), None);
        assert_eq!(help.code, 0);
        let help = text(&help.stdout);
        assert!(help.contains("Example: capexec "), "{subcommand}");
        // A subcommand's help opens with its own text, the one the list
        // of subcommands shows (not that of a struct of its arguments).
        let listed = listed_about(&overview, subcommand);
        let first = help.lines().next().unwrap_or_default();
        assert_eq!(first.trim_end_matches('.'), listed, "{subcommand}");
    }
}

#[test]
fn an_upstream_can_be_a_named_server() {
    let far = Served::start();
    let config = TempDir::new("cli-config-upstream");
    write_config(
        config.path(),
        &format!(
            "[servers.far]\naddress = \"{}\"\ntoken-file = \"{}\"\n",
            far.tcp,
            far.token_arg()
        ),
    );
    let socket = config.path().join("front.sock");
    let front_address = format!("unix:{}", socket.display());
    let mut serve = configured(
        config.path(),
        "serve",
        &[
            "--listen",
            &front_address,
            "--upstream",
            "b=far",
            "--default",
            "b",
        ],
    );
    serve.stderr(Stdio::null());
    let (mut front, line) = common::cli::spawn_reading_first_line(serve);
    assert_eq!(line.trim(), front_address);
    let ran = finish(
        configured(
            config.path(),
            "run",
            &["--connect", &front_address, "--", "echo", "via"],
        ),
        None,
    );
    assert_eq!(
        (ran.code, text(&ran.stdout), text(&ran.stderr)),
        (0, "via\n".to_string(), String::new())
    );
    let _ = front.kill();
    let _ = front.wait();
    let unknown = finish(
        configured(
            config.path(),
            "serve",
            &["--listen", &front_address, "--upstream", "b=nope"],
        ),
        None,
    );
    assert_eq!(
        (unknown.code, text(&unknown.stderr)),
        (
            125,
            "capexec: --upstream b: \"nope\": an address is unix:PATH or tcp:HOST:PORT, or the \
             name of a server in the configuration file\n"
                .to_string()
        )
    );
}

/// The text `capexec --help` lists for `subcommand`.
fn listed_about(overview: &str, subcommand: &str) -> String {
    overview
        .lines()
        .find_map(|line| {
            let mut words = line.trim_start().splitn(2, ' ');
            (line.starts_with("  ") && words.next() == Some(subcommand))
                .then(|| words.next().unwrap_or_default().trim().to_string())
        })
        .unwrap_or_else(|| panic!("{subcommand} is not listed in:\n{overview}"))
}

/// `--json` wherever a command prints a table or a record: one document on
/// stdout, with the field names docs/GUIDE.md lists.
#[test]
fn tables_and_records_come_as_json_on_request() {
    let served = Served::start_with(&["--upstream", "far=unix:/nonexistent", "--tls-self-signed"]);
    let config = TempDir::new("cli-json");
    let runtime = TempDir::new("cli-json-runtime");
    let file = write_config(
        config.path(),
        &format!(
            "[servers.box]\naddress = \"{}\"\nenvironment = \"far\"\n\n[servers.net]\naddress = \
             \"{}\"\ntoken-file = \"{}\"\ntls-pin = \"{}\"\n",
            served.unix,
            served.tcp,
            served.token_arg(),
            "ab".repeat(32)
        ),
    );
    let output = |subcommand: &str, args: &[&str]| {
        let mut command = configured(config.path(), subcommand, args);
        command.env("XDG_RUNTIME_DIR", runtime.path());
        let done = finish(command, None);
        assert_eq!(done.code, 0, "{subcommand}: {}", text(&done.stderr));
        text(&done.stdout)
    };
    let json = |subcommand: &str, args: &[&str]| {
        let stdout = output(subcommand, args);
        assert!(
            stdout.ends_with("}\n") || stdout.ends_with("]\n"),
            "{stdout}"
        );
        assert_eq!(stdout.lines().count(), 1, "{stdout}");
        stdout
    };
    assert_eq!(
        json("servers", &["--json"]),
        format!(
            "[{{\"address\":\"{unix}\",\"environment\":\"far\",\"file\":\"{file}\",\"line\":1,\
             \"name\":\"box\",\"tls\":null,\"tls_ca\":null,\"tls_pin\":null,\"token_file\":null}},\
             {{\"address\":\"{tcp}\",\"environment\":null,\"file\":\"{file}\",\"line\":5,\
             \"name\":\"net\",\"tls\":\"pin\",\"tls_ca\":null,\"tls_pin\":\"{pin}\",\
             \"token_file\":\"{token}\"}},{{\"address\":\"unix:{runtime}/capexec/capexec.sock\",\
             \"environment\":null,\"file\":null,\"line\":null,\"name\":\"local\",\"tls\":null,\
             \"tls_ca\":null,\"tls_pin\":null,\"token_file\":null}}]\n",
            unix = served.unix,
            tcp = served.tcp,
            file = file.display(),
            pin = "ab".repeat(32),
            token = served.token_arg(),
            runtime = runtime.path().display()
        )
    );
    assert_eq!(
        json("environments", &["--connect", &served.unix, "--json"]),
        "[{\"address\":null,\"default\":true,\"name\":\"local\",\"reason\":null,\
         \"retry_in_ms\":null,\"state\":\"local\"},{\"address\":\"unix:/nonexistent\",\
         \"default\":false,\"name\":\"far\",\"reason\":null,\"retry_in_ms\":null,\
         \"state\":\"idle\"}]\n"
    );
    let info: serde_json::Value =
        serde_json::from_str(&json("info", &["--connect", &served.unix, "--json"]))
            .expect("info is JSON");
    let lines = output("info", &["--connect", &served.unix]);
    let object = info.as_object().expect("an object");
    let keys: Vec<&str> = object.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "arch",
            "cwd",
            "environment",
            "features",
            "hostname",
            "os",
            "shell",
            "temp",
            "version"
        ]
    );
    // The same values as the lines, under the lines' labels.
    for line in lines.lines() {
        let (label, value) = line.split_once(": ").expect("label: value");
        let json_value = match &object[label] {
            serde_json::Value::Array(features) => features
                .iter()
                .map(|f| f.as_str().expect("a feature"))
                .collect::<Vec<_>>()
                .join(" "),
            other => other.as_str().expect("a string").to_string(),
        };
        assert_eq!(json_value, value, "{label}");
    }
    let cert = served.home.path().join(".config/capexec/server-cert.pem");
    let fingerprint = capexec::net::TlsServer::certificate_fingerprint(&cert).expect("cert");
    let client = finish(
        served.command(
            "client-config",
            &[
                "build",
                "--address",
                &served.tcp,
                "--token-file",
                &served.token_arg(),
                "--tls-self-signed",
                "--json",
            ],
        ),
        None,
    );
    assert_eq!(
        (client.code, text(&client.stdout)),
        (
            0,
            format!(
                "{{\"address\":\"{}\",\"name\":\"build\",\"tls_pin\":\"{fingerprint}\",\
                 \"token\":\"{}\"}}\n",
                served.tcp,
                served.token().as_str()
            )
        )
    );
}
