//! Reads built seeds back with readers that share no code with the writer: Debian's `xorriso`
//! (Rock Ridge), `isoinfo` (primary, Joliet and Rock Ridge trees), `blkid` (the label cloud-init
//! searches for) and, in process, the `isomage` crate (Joliet).
//!
//! The external tools are required: CI installs them (`apt-get install -y xorriso genisoimage`),
//! and a missing one fails the test with that instruction rather than skipping it.

use std::collections::BTreeMap;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::process::Command;

use nocloud::{SEED_LABEL, Seed, build_seed_iso, meta_data, vendor_data};

const NAME: &str = "proxy-reconaaaaaaaaaaa";

fn seed(user_data: &str, install_guest_agent: bool) -> Seed {
    Seed {
        name: NAME.to_owned(),
        user_data: user_data.to_owned(),
        install_guest_agent,
    }
}

/// The files a seed must carry, by name.
fn expected_files(seed: &Seed) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::from([
        ("meta-data".to_owned(), meta_data(&seed.name).into_bytes()),
        ("user-data".to_owned(), seed.user_data.clone().into_bytes()),
    ]);
    if seed.install_guest_agent {
        files.insert("vendor-data".to_owned(), vendor_data().as_bytes().to_vec());
    }
    files
}

/// A built seed written to its own temporary directory (removed on drop).
struct SeedFile {
    dir: tempfile::TempDir,
    iso: PathBuf,
}

impl SeedFile {
    fn build(seed: &Seed) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let iso = dir.path().join("seed.iso");
        std::fs::write(&iso, build_seed_iso(seed).expect("seed builds")).expect("write seed.iso");
        Self { dir, iso }
    }
}

/// Runs a reader tool and returns its stdout; a missing tool or a failed run fails the test.
fn run(tool: &str, args: &[&str]) -> Vec<u8> {
    let output = Command::new(tool).args(args).output().unwrap_or_else(|error| {
        panic!(
            "cannot run `{tool}` ({error}); the read-back tests need xorriso, isoinfo and blkid: \
             apt-get install -y xorriso genisoimage util-linux"
        )
    });
    assert!(
        output.status.success(),
        "`{tool} {}` failed: {}\n{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

fn text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).expect("tool output is UTF-8")
}

/// Every regular file under `dir`, by name (seeds have no subdirectories).
fn read_dir_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .expect("extracted directory")
        .map(|entry| {
            let entry = entry.expect("directory entry");
            assert!(
                entry.file_type().unwrap().is_file(),
                "unexpected entry {:?}",
                entry.path()
            );
            (
                entry.file_name().into_string().unwrap(),
                std::fs::read(entry.path()).unwrap(),
            )
        })
        .collect()
}

/// Extracts the whole image with xorriso, which reads the Rock Ridge tree, as a Linux mount does.
fn extract_with_xorriso(file: &SeedFile) -> BTreeMap<String, Vec<u8>> {
    let out = file.dir.path().join("extracted");
    let (iso, out_arg) = (file.iso.to_str().unwrap(), out.to_str().unwrap());
    run(
        "xorriso",
        &["-indev", iso, "-osirrox", "on", "-extract", "/", out_arg],
    );
    read_dir_files(&out)
}

/// The file names isoinfo lists in the root of one tree (`-R` Rock Ridge, `-J` Joliet, none for
/// the plain ISO 9660 tree).
fn isoinfo_names(file: &SeedFile, tree_flag: Option<&str>) -> Vec<String> {
    let mut args: Vec<&str> = tree_flag.into_iter().collect();
    args.extend(["-l", "-i", file.iso.to_str().unwrap()]);
    let listing = text(run("isoinfo", &args));
    // Entry lines end with "]  NAME " after the extent and flags column.
    let mut names: Vec<String> = listing
        .lines()
        .filter_map(|line| {
            line.split_once("]  ")
                .map(|(_, name)| name.trim_end().to_owned())
        })
        .filter(|name| !name.is_empty() && name != "." && name != ".." && name != "\u{1}")
        .collect();
    names.sort();
    names
}

fn isoinfo_extract(file: &SeedFile, tree_flag: &str, path: &str) -> Vec<u8> {
    run(
        "isoinfo",
        &[tree_flag, "-x", path, "-i", file.iso.to_str().unwrap()],
    )
}

fn assert_all_trees_hold(seed: &Seed) {
    let file = SeedFile::build(seed);
    let expected = expected_files(seed);
    let names: Vec<String> = expected.keys().cloned().collect();

    assert_eq!(
        extract_with_xorriso(&file),
        expected,
        "xorriso (Rock Ridge) read-back"
    );
    assert_eq!(isoinfo_names(&file, Some("-R")), names, "Rock Ridge names");
    assert_eq!(isoinfo_names(&file, Some("-J")), names, "Joliet names");
    for (name, bytes) in &expected {
        let path = format!("/{name}");
        assert_eq!(&isoinfo_extract(&file, "-J", &path), bytes, "Joliet {path}");
        assert_eq!(
            &isoinfo_extract(&file, "-R", &path),
            bytes,
            "Rock Ridge {path}"
        );
    }
}

#[test]
fn every_tree_holds_the_three_files_byte_for_byte() {
    let seed = seed("#cloud-config\nhostname: proxy\n", true);
    assert_all_trees_hold(&seed);
    // The literal the guest reads, not just what `meta_data` returns (instance-id = proxy name).
    let extracted = extract_with_xorriso(&SeedFile::build(&seed));
    assert_eq!(
        extracted["meta-data"],
        b"instance-id: proxy-reconaaaaaaaaaaa\nlocal-hostname: proxy-reconaaaaaaaaaaa\n"
    );
    let vendor = String::from_utf8(extracted["vendor-data"].clone()).unwrap();
    assert!(vendor.starts_with("#cloud-config\n") && vendor.contains("qemu-guest-agent"));
}

#[test]
fn without_guest_agent_there_is_no_vendor_data() {
    let seed = seed("#cloud-config\n", false);
    assert_all_trees_hold(&seed);
    let extracted = extract_with_xorriso(&SeedFile::build(&seed));
    assert!(
        !extracted.contains_key("vendor-data"),
        "{:?}",
        extracted.keys()
    );
}

#[test]
fn large_user_data_spans_many_sectors_intact() {
    // 100 KiB of varied lines (50 sectors), so a wrong extent or length shows.
    let mut user_data = String::from("#cloud-config\nwrite_files:\n");
    let mut line = 0;
    while user_data.len() < 100 * 1024 {
        user_data.push_str(&format!(
            "  - path: /etc/proxy/{line:05}\n    content: line {line}\n"
        ));
        line += 1;
    }
    assert_all_trees_hold(&seed(&user_data, true));
}

#[test]
fn non_ascii_user_data_survives_byte_for_byte() {
    let user_data =
        "#cloud-config\n# Grüße, 日本語, emoji 🛡️, nul-free\nbootcmd:\n  - echo \"ß→∑\"\n";
    assert_all_trees_hold(&seed(user_data, true));
}

#[test]
fn empty_user_data_is_an_empty_file() {
    assert_all_trees_hold(&seed("", false));
}

#[test]
fn volume_label_is_cidata_in_primary_and_joliet_descriptors() {
    let file = SeedFile::build(&seed("#cloud-config\n", true));
    let description = text(run("isoinfo", &["-d", "-i", file.iso.to_str().unwrap()]));
    assert!(
        description
            .lines()
            .any(|line| line == format!("Volume id: {SEED_LABEL}")),
        "{description}"
    );
    assert!(
        description.contains("Joliet with UCS level 3 found"),
        "{description}"
    );
    assert!(
        description.contains("Rock Ridge signatures version 1 found"),
        "{description}"
    );

    // blkid reports the Joliet label when there is one; cloud-init finds the seed through it.
    let label = text(run(
        "blkid",
        &[
            "-p",
            "-o",
            "value",
            "-s",
            "LABEL",
            file.iso.to_str().unwrap(),
        ],
    ));
    assert_eq!(label.trim_end(), SEED_LABEL);
    let kind = text(run(
        "blkid",
        &[
            "-p",
            "-o",
            "value",
            "-s",
            "TYPE",
            file.iso.to_str().unwrap(),
        ],
    ));
    assert_eq!(kind.trim_end(), "iso9660");
}

#[test]
fn plain_iso9660_tree_uses_level_1_names() {
    // Without the extensions the names are uppercase 8.3 with a version; this is why Joliet and
    // Rock Ridge are needed at all.
    let file = SeedFile::build(&seed("#cloud-config\n", true));
    assert_eq!(
        isoinfo_names(&file, None),
        ["META_DAT.;1", "USER_DAT.;1", "VENDOR_D.;1"]
    );
}

#[test]
fn in_process_reader_sees_the_joliet_tree() {
    let seed = seed("#cloud-config\n# ünïcödé\n", true);
    let mut image = Cursor::new(build_seed_iso(&seed).unwrap());
    let root = isomage::detect_and_parse_filesystem(&mut image, "seed.iso")
        .expect("isomage parses the seed");
    let mut found = BTreeMap::new();
    for child in &root.children {
        assert!(!child.is_directory, "unexpected directory {}", child.name);
        let mut bytes = Vec::new();
        isomage::cat_node(&mut image, child, &mut bytes).expect("isomage reads the file");
        found.insert(child.name.clone(), bytes);
    }
    assert_eq!(found, expected_files(&seed));
}

#[test]
fn two_builds_are_identical_on_disk() {
    let seed = seed("#cloud-config\nhostname: proxy\n", true);
    let first = std::fs::read(SeedFile::build(&seed).iso).unwrap();
    let second = std::fs::read(SeedFile::build(&seed).iso).unwrap();
    assert_eq!(first, second);
}
