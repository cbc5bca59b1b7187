mod cli;

fn main() {
    // Before any connection, for the embedded executor's too.
    capexec::rpc::tune_allocator();
    std::process::exit(cli::main());
}

/// Notes which of fds 0, 1 and 2 the caller left closed (`capexec run ...
/// >&-`). It must run before Rust's runtime starts: that reopens closed
/// standard descriptors on /dev/null, where output would vanish without an
/// error. The loader runs `.init_array` entries before `main`.
#[used]
#[unsafe(link_section = ".init_array")]
static NOTE_CLOSED_STANDARD_FDS: extern "C" fn() = {
    extern "C" fn note() {
        for fd in 0..3 {
            // SAFETY: F_GETFD only asks whether the descriptor is open.
            if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
                cli::stdio::note_closed_at_start(fd);
            }
        }
    }
    note
};
