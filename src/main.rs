mod cli;

fn main() {
    // SAFETY: mallopt only tunes the allocator; called before any threads.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 16 << 20);
    }
    std::process::exit(cli::main());
}
