//! Compiles in a digest of the Lua scripts (`lua/*.lua`), so instances running different
//! scripts tell each other apart (`vq fleet`: setting `lua.digest`).

fn main() {
    println!("cargo:rerun-if-changed=lua");
    let mut files: Vec<_> = std::fs::read_dir("lua")
        .expect("lua/ holds the scripts")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "lua"))
        .collect();
    files.sort();
    // FNV-1a, 64 bits: a fingerprint, not a defence.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for path in files {
        let name = path.file_name().expect("a file").to_string_lossy().into_owned();
        let text = std::fs::read(&path).expect("a readable script");
        for byte in name.bytes().chain([0]).chain(text).chain([0]) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    println!("cargo:rustc-env=LUA_SCRIPTS_DIGEST={hash:016x}");
}
