#!/usr/bin/env bash
# Build a tiny BIOS-bootable test guest from Debian packages, no root needed
# (except to apt-get install missing tools):
#   OUTDIR/egress-test-guest.raw, .qcow2 and .qcow2.sha256 (hex of the qcow2).
# Disk = one FAT file system, no partition table ("superfloppy"), holding
# SYSLINUX + Debian's kernel + a busybox initramfs (rootfs/ beside this script).
# SeaBIOS loads SYSLINUX from the boot sector of the virtio disk; nothing is
# mounted: mtools writes into the image file, syslinux installs through mtools.
# Usage: build.sh OUTDIR
set -euo pipefail
out=${1:?usage: build.sh OUTDIR}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
name=egress-test-guest
raw=$out/$name.raw qcow=$out/$name.qcow2 sum=$out/$name.qcow2.sha256

# Cheap re-run: all outputs exist and the checksum (written last) is newer than
# every input file here (build.sh and rootfs/).
if [ -f "$raw" ] && [ -f "$qcow" ] && [ -f "$sum" ] &&
   [ -z "$(find "$here" -type f -newer "$sum" -print -quit)" ]; then
  exit 0
fi

sudo=; [ "$(id -u)" = 0 ] || sudo=sudo
apt_install() { # wait for another apt/dpkg (DPkg::Lock::Timeout) rather than fail
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    -o DPkg::Lock::Timeout=600 "$@"
}
# Host tools (installed): mformat/mcopy, the mtools-based syslinux installer,
# qemu-img, cpio.
missing=()
command -v mcopy >/dev/null || missing+=(mtools)
command -v syslinux >/dev/null || missing+=(syslinux)
command -v qemu-img >/dev/null || missing+=(qemu-utils)
command -v cpio >/dev/null || missing+=(cpio)  # GNU: busybox's can't renumber inodes
if [ ${#missing[@]} -gt 0 ]; then
  apt_install "${missing[@]}" || { $sudo apt-get update -q && apt_install "${missing[@]}"; }
fi

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"

# Guest packages (download only, unpacked here): the kernel behind the
# linux-image-amd64 meta package, and busybox-static. Not -cloud-amd64: it is
# bigger (14 MiB vmlinuz vs 8) and has no AHCI driver, so q35's SATA seed CD
# would be unreadable.
dl() { apt-get download -q "$@" >/dev/null 2>&1 || { $sudo apt-get update -q && apt-get download -q "$@"; }; }
dl linux-image-amd64
kpkg=$(dpkg-deb -f linux-image-amd64_*.deb Depends | grep -o 'linux-image-[0-9][^ ,]*' | head -n1)
dl "$kpkg" busybox-static
for d in "$kpkg"_*.deb busybox-static_*.deb; do dpkg-deb -x "$d" x; done
kver=$(ls x/lib/modules); bb=x/bin/busybox
echo "build.sh: kernel $kver, $($bb | head -n1)" >&2

# initramfs: busybox, our rootfs/, and only the modules init loads plus their
# dependencies (taken from a modules.dep that busybox depmod writes).
r=root; mkdir -p $r/bin $r/dev $r/proc $r/sys $r/lib/modules/"$kver"
cp $bb $r/bin/busybox; cp -a "$here"/rootfs/. $r/
$bb depmod -b x "$kver"
for m in virtio_pci virtio_net ahci sr_mod isofs button evdev; do
  line=$(grep -E "^[^:]*/$m\.ko:" x/lib/modules/"$kver"/modules.dep) || { echo "no module $m" >&2; exit 1; }
  for f in ${line/:/}; do
    mkdir -p "$r/lib/modules/$kver/$(dirname "$f")"; cp "x/lib/modules/$kver/$f" "$r/lib/modules/$kver/$f"
  done
done
$bb depmod -b $r "$kver"
# Fixed timestamps, FAT serial and file order make the image reproducible.
export SOURCE_DATE_EPOCH=1700000000  # mtools honours it too
find $r -exec touch -h -d @"$SOURCE_DATE_EPOCH" {} +
(cd $r && find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 --reproducible --quiet) | gzip -9n > initrd.img
cp x/boot/vmlinuz-"$kver" vmlinuz

# SYSLINUX config: kernel and initrd sit next to it in the FAT root.
# edd=off: the kernel's BIOS disk probe costs ~3 s under TCG; nothing uses it.
cat > syslinux.cfg <<'EOF'
DEFAULT linux
PROMPT 0
TIMEOUT 0
LABEL linux
  KERNEL /vmlinuz
  APPEND initrd=/initrd.img console=ttyS0,115200 panic=10 loglevel=4 edd=off
EOF

# FAT image: payload + 2 MiB of slack, rounded up to whole MiB.
mib=$(( ($(stat -c %s vmlinuz) + $(stat -c %s initrd.img)) / 1048576 + 3 ))
truncate -s ${mib}M disk.raw
export MTOOLS_SKIP_CHECK=1
mformat -i disk.raw -v EGRESSGUEST -N 0e9e5500 ::
mcopy -i disk.raw vmlinuz initrd.img syslinux.cfg ::
syslinux --install disk.raw
qemu-img convert -q -f raw -O qcow2 disk.raw disk.qcow2

# Publish atomically, checksum last (it is the freshness marker above).
mkdir -p "$out"
mv disk.raw "$raw"; mv disk.qcow2 "$qcow"
sha256sum "$qcow" | cut -d' ' -f1 > "$sum.tmp" && mv "$sum.tmp" "$sum"
echo "build.sh: wrote $raw ($mib MiB), $qcow, $sum" >&2
