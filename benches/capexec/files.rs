//! Files: a large file downloaded and uploaded over a Unix socket, TCP
//! and TLS next to a local `cat FILE | cat > /dev/null` and scp (both
//! ways, aes128-gcm) on loopback; `capexec cp -r` of many small files next
//! to `cp -r` and `scp -r`; a walk of a huge tree with the server's
//! memory. scp runs against an sshd of the bench's own on a loopback port
//! (`ssh.rs`); without sshd its rows are skipped, saying why. An upload
//! over TLS is shown against its floor too: the local copy with one TLS
//! hop between its two `cat`s (`hop.rs`, `sealed.rs`), the least any TLS
//! connection moving the file costs.

use std::error::Error;
use std::path::Path;
use std::time::{Duration, Instant};

use capexec::client::Directory;
use capexec::model::{WalkOptions, WriteOptions};
use futures::StreamExt;

use crate::Plan;
use crate::hop;
use crate::report::{Report, RowId, Target};
use crate::servers::{CAPEXEC, Servers};
use crate::ssh::Sshd;
use crate::wall::time_process;

const SECTION: &str = "files";
const TLS_HOP_FLOOR: &str = "the TLS-hop floor";

pub async fn run(
    plan: &Plan,
    servers: &Servers,
    report: &mut Report,
) -> Result<(), Box<dyn Error>> {
    let dir = tempfile::tempdir()?;
    let big = dir.path().join("big");
    let size = plan.file_bytes;
    make_file(&big, size)?;
    settle_disk();
    let sshd = Sshd::start();
    if let Err(reason) = &sshd {
        eprintln!("files: no scp rows: {reason}");
        report.figure(SECTION, "scp", format!("not measured: {reason}"), None);
    }
    eprintln!(
        "files: {} MiB down and up, {} round(s)",
        size >> 20,
        plan.file_rounds
    );
    let (executor, _connection) = servers.unix.connect().await?;
    let remote = Directory::open(&executor, dir.path());
    // The same directory through the TCP and the TLS server.
    let (tcp_executor, _tcp_connection) = servers.tcp.connect().await?;
    let (tls_executor, _tls_connection) = servers.tls.connect().await?;
    let networked = [
        ("tcp", Directory::open(&tcp_executor, dir.path())),
        ("tls", Directory::open(&tls_executor, dir.path())),
    ];
    let (mut local, mut down, mut scp) = (Vec::new(), Vec::new(), Vec::new());
    let mut scp_down = Vec::new();
    let (mut net_down, mut net_up) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    let (mut local_new, mut up_new) = (Vec::new(), Vec::new());
    let mut hop_new = Vec::new();
    let (mut local_replace, mut up_replace) = (Vec::new(), Vec::new());
    let cat = format!("cat {} | cat > /dev/null", big.display());
    // Uploads write files: each has a local counterpart doing the same to
    // the same disk, so the ratio measures capexec and not the disk. Every
    // written file is removed after its timing, in both columns: a copy
    // removed before the kernel wrote it back costs no disk time, one left
    // behind would tax the next row with its write-back.
    let copy = dir.path().join("local-copy");
    let cat_to_new = format!("cat {} | cat > {}", big.display(), copy.display());
    // Replacing a file atomically: ext4 writes the new content back when a
    // rename replaces a file (so that a crash cannot leave it empty), and
    // the rename waits for that, locally as through capexec.
    let staged = dir.path().join("local-copy.tmp");
    let cat_replacing = format!(
        "cat {big} | cat > {staged} && mv {staged} {copy}",
        big = big.display(),
        staged = staged.display(),
        copy = copy.display()
    );
    let uploaded = dir.path().join("uploaded");
    let old_content = b"the old content\n";
    for _ in 0..plan.file_rounds {
        local.push(time_process("sh", &["-c", &cat], None)?);
        down.push(timed_download(&remote, size).await?);
        for (samples, (_, directory)) in net_down.iter_mut().zip(&networked) {
            samples.push(timed_download(directory, size).await?);
        }
        if let Ok(sshd) = &sshd {
            let from = sshd.remote(&big);
            scp_down.push(sshd.scp(&[from.as_ref(), "/dev/null".as_ref()])?);
        }

        local_new.push(timed_writing(&cat_to_new, &copy)?);
        up_new.push(timed_upload(&remote, &big, size, &uploaded).await?);
        for (samples, (_, directory)) in net_up.iter_mut().zip(&networked) {
            samples.push(timed_upload(directory, &big, size, &uploaded).await?);
        }
        hop_new.push(timed_hop_writing(&big, size, &copy)?);

        std::fs::write(&copy, old_content)?;
        local_replace.push(timed_writing(&cat_replacing, &copy)?);
        std::fs::write(&uploaded, old_content)?;
        up_replace.push(timed_upload(&remote, &big, size, &uploaded).await?);

        if let Ok(sshd) = &sshd {
            let to = dir.path().join("scp-copy");
            scp.push(sshd.scp(&[big.as_os_str(), sshd.remote(&to).as_ref()])?);
            std::fs::remove_file(&to)?;
            settle_disk();
        }
    }
    let baseline = report.baseline(
        SECTION,
        "local: cat FILE | cat > /dev/null",
        local,
        Some(size),
    );
    report.case(
        SECTION,
        "unix: Directory.download",
        down,
        baseline,
        Some(size),
        Some(Target::AtLeastShare(0.6)),
        "",
    );
    // Over TLS at least 60 % of the local copy and twice scp's rate, the
    // same way; over TCP no target of its own.
    let mut tls_down = None;
    for (samples, (name, _)) in net_down.into_iter().zip(&networked) {
        let tls = *name == "tls";
        let row = report.case(
            SECTION,
            format!("{name}: Directory.download"),
            samples,
            baseline,
            Some(size),
            tls.then_some(Target::AtLeastShare(0.6)),
            "",
        );
        if tls {
            tls_down = Some(row);
        }
    }
    report.case(
        SECTION,
        "unix: Directory.upload (atomic) of a new file, vs reading",
        up_new.clone(),
        baseline,
        Some(size),
        None,
        "",
    );
    let mut scp_up = None;
    if !scp.is_empty() {
        scp_up = Some(report.case(
            SECTION,
            "scp to loopback sshd (aes128-gcm)",
            scp,
            baseline,
            Some(size),
            None,
            "",
        ));
        let scp_down = report.case(
            SECTION,
            "scp from loopback sshd (aes128-gcm) to /dev/null",
            scp_down,
            baseline,
            Some(size),
            None,
            "",
        );
        if let Some(tls_down) = tls_down {
            report.also(tls_down, twice_scp(scp_down));
        }
    }
    let writing = report.baseline(
        SECTION,
        "local: cat FILE | cat > NEW (same disk)",
        local_new,
        Some(size),
    );
    report.case(
        SECTION,
        "unix: Directory.upload (atomic) of a new file, vs writing",
        up_new,
        writing,
        Some(size),
        // An upload writes the file: its local counterpart is the pipe
        // copy that writes one too (writing alone can take longer than
        // 60 % of the read-only pipe allows).
        Some(Target::AtLeastShare(0.6)),
        "",
    );
    let hop_floor = report.case(
        SECTION,
        format!(
            "`cat FILE | {} | cat > NEW` (same disk, one TLS hop: {TLS_HOP_FLOOR})",
            hop::Kind::Sealed.shown()
        ),
        hop_new,
        writing,
        Some(size),
        None,
        "",
    );
    report.reach(
        SECTION,
        format!("60 % of the local copy against {TLS_HOP_FLOOR}, an upload"),
        0.6,
        writing.row(),
        hop_floor,
    );
    for (samples, (name, _)) in net_up.into_iter().zip(&networked) {
        let tls = *name == "tls";
        let row = report.case(
            SECTION,
            format!("{name}: Directory.upload (atomic) of a new file, vs writing"),
            samples,
            writing,
            Some(size),
            tls.then_some(Target::AtLeastShare(0.6)),
            "",
        );
        if tls {
            report.relative(row, hop_floor, TLS_HOP_FLOOR);
        }
        if let (true, Some(scp_up)) = (tls, scp_up) {
            report.also(row, twice_scp(scp_up));
        }
    }
    let replacing = report.baseline(
        SECTION,
        "local: cat FILE | cat > TMP && mv TMP OLD (same disk)",
        local_replace,
        Some(size),
    );
    report.case(
        SECTION,
        "unix: Directory.upload (atomic) replacing a file",
        up_replace,
        replacing,
        Some(size),
        None,
        "",
    );

    let files = plan.small_files;
    eprintln!("files: cp -r of {files} small files");
    let tree = dir.path().join("tree");
    make_tree(&tree, files)?;
    let (connect, _) = servers.unix.cli_args();
    let (mut local, mut ours, mut scp) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..plan.file_rounds.min(3) {
        let to = dir.path().join(format!("cp-{round}"));
        local.push(time_process(
            "cp",
            &["-r".as_ref(), tree.as_os_str(), to.as_os_str()],
            None,
        )?);
        let to = dir.path().join(format!("capexec-{round}"));
        let mut args = vec!["cp".to_string(), "-r".to_string()];
        args.extend(connect.iter().cloned());
        args.push(tree.display().to_string());
        args.push(format!(":{}", to.display()));
        ours.push(time_process(CAPEXEC, &args, None)?);
        if let Ok(sshd) = &sshd {
            let to = dir.path().join(format!("scp-{round}"));
            scp.push(sshd.scp(&["-r".as_ref(), tree.as_os_str(), sshd.remote(&to).as_ref()])?);
        }
    }
    let baseline = report.baseline(
        SECTION,
        format!("local: cp -r of {files} files"),
        local,
        None,
    );
    report.case(
        SECTION,
        format!("capexec cp -r over unix, {files} files"),
        ours,
        baseline,
        None,
        None,
        "",
    );
    if !scp.is_empty() {
        report.case(
            SECTION,
            format!("scp -r to loopback sshd, {files} files"),
            scp,
            baseline,
            None,
            None,
            "",
        );
    }

    let entries = plan.walk_entries;
    eprintln!("files: walk of {entries} entries");
    let wide = dir.path().join("wide");
    make_tree(&wide, entries)?;
    let before = servers.unix.usage()?;
    let started = Instant::now();
    let mut walk = remote.walk("wide", &WalkOptions::default()).await;
    let mut seen = 0usize;
    let mut peak = before.rss_kib;
    while let Some(entry) = walk.next().await {
        entry?;
        seen += 1;
        if seen.is_multiple_of(10_000) {
            peak = peak.max(servers.unix.usage()?.rss_kib);
        }
    }
    let elapsed = started.elapsed();
    let expected = entries + entries.div_ceil(1000);
    report.figure(
        SECTION,
        format!("walk of {seen} entries over unix"),
        format!(
            "{:.0} ms ({:.0} entries/s); server RSS {} KiB before, at most {} KiB during",
            elapsed.as_secs_f64() * 1e3,
            seen as f64 / elapsed.as_secs_f64(),
            before.rss_kib,
            peak
        ),
        Some((format!("all {expected} entries"), seen == expected)),
    );
    Ok(())
}

/// Moves at least twice scp's bytes per second (the row `scp`, the same
/// direction).
fn twice_scp(scp: RowId) -> Target {
    Target::AtLeastRateOf {
        of: scp,
        times: 2.0,
        name: "scp",
    }
}

/// The time of downloading the file `big` (`size` bytes) from `remote`
/// into a sink.
async fn timed_download(remote: &Directory, size: u64) -> Result<Duration, Box<dyn Error>> {
    let started = Instant::now();
    let (got, _) = remote.download("big", tokio::io::sink()).await?;
    let took = started.elapsed();
    if got != size {
        return Err(format!("download: {got} of {size} bytes").into());
    }
    Ok(took)
}

/// The time of shell `line`, which writes `written`; the file is then
/// removed and the disk left to settle, untimed.
fn timed_writing(line: &str, written: &Path) -> Result<Duration, Box<dyn Error>> {
    let took = time_process("sh", &["-c", line], None)?;
    std::fs::remove_file(written)?;
    settle_disk();
    Ok(took)
}

/// The time of `cat big | <TLS hop> | cat > written`, the floor of an
/// upload over TLS; the file is then removed and the disk left to settle,
/// untimed.
fn timed_hop_writing(big: &Path, size: u64, written: &Path) -> Result<Duration, Box<dyn Error>> {
    let chains = [
        vec![vec!["cat".to_string(), big.display().to_string()]],
        vec![vec![
            "sh".to_string(),
            "-c".to_string(),
            format!("cat > '{}'", written.display()),
        ]],
    ];
    let took = hop::run(&chains, hop::Kind::Sealed)?.took;
    let arrived = std::fs::metadata(written)?.len();
    if arrived != size {
        return Err(format!("through the TLS hop: {arrived} of {size} bytes").into());
    }
    std::fs::remove_file(written)?;
    settle_disk();
    Ok(took)
}

/// The time of uploading `big` (`size` bytes) to `uploaded` (a file
/// directly in `remote`), which is then removed and the disk left to
/// settle, untimed.
async fn timed_upload(
    remote: &Directory,
    big: &Path,
    size: u64,
    uploaded: &Path,
) -> Result<Duration, Box<dyn Error>> {
    let name = uploaded.file_name().ok_or("an upload names a file")?;
    let started = Instant::now();
    let file = tokio::fs::File::open(big).await?;
    remote
        .upload(name, file, &WriteOptions::default(), Some(size))
        .await?;
    let took = started.elapsed();
    std::fs::remove_file(uploaded)?;
    settle_disk();
    Ok(took)
}

/// Waits until nothing is being written back, so that the write-back a
/// case started (ext4 starts one at a rename that replaces a file) is not
/// charged to the next case.
fn settle_disk() {
    rustix::fs::sync();
}

fn make_file(path: &Path, size: u64) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut chunk = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        for word in chunk.chunks_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            word.copy_from_slice(&state.to_le_bytes()[..word.len()]);
        }
        let n = left.min(chunk.len() as u64) as usize;
        file.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    file.flush()
}

/// `count` files of 1-4 KiB, 1,000 to a directory.
fn make_tree(root: &Path, count: usize) -> std::io::Result<()> {
    for index in 0..count {
        let dir = root.join(format!("d{}", index / 1000));
        if index.is_multiple_of(1000) {
            std::fs::create_dir_all(&dir)?;
        }
        let size = 1024 + (index * 37) % 3072;
        std::fs::write(dir.join(format!("f{index}")), vec![b'x'; size])?;
    }
    Ok(())
}
