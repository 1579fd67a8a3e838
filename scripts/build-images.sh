#!/usr/bin/env bash
# Builds Shoal's guest images, cached.
#
#   scripts/build-images.sh [tiny|base|all|vm]   (default: all; vm only when named)
#
#   tiny: busybox-static + /sbin/shoal-agent (also /init), as tiny.erofs
#         (read-only root) and tiny.cpio (uncompressed newc initramfs).
#         Also agent.erofs: only /sbin/shoal-agent and empty mount points,
#         the root of container sandboxes (the image's layers go over it).
#   base: minimal Debian bookworm (minbase + python3, bash, ca-certificates),
#         stripped, with /sbin/shoal-agent and the account `user` (uid 1000,
#         home /home/user: the E2B SDK's default user), as base.erofs.
#   vm:   a disk for the `vm` kind (QEMU), from the same debootstrap result
#         as base (Debian packages only): ext4 (LABEL=shoal-root), the
#         agent at /usr/local/sbin/shoal-agent (and /sbin/shoal-agent) and
#         as the systemd unit shoal-agent.service (enabled; for guests that
#         boot systemd), made raw and converted to vm.qcow2. No kernel or
#         bootloader: Shoal's kernel boots it (root=/dev/vda, init=the
#         agent). Size: SHOAL_VM_DISK_SIZE (default 2G, sparse).
#
#   The erofs images are DAX-ready for virtio-pmem (/dev/pmem0 with
#   rootflags=dax) and work as virtio-blk disks too: uncompressed, 4 KiB
#   blocks, no inline (tail-packed) data (-E noinline_data: Linux 6.1 maps
#   only flat files with DAX), zero-padded to a multiple of 2 MiB (a guest
#   maps pmem in 2 MiB sub-sections).
#
# stdout: exactly `tiny_erofs=PATH`, `tiny_cpio=PATH`, `tiny_agent_erofs=PATH`,
# `base_erofs=PATH`, `vm_qcow2=PATH` (those
# built for the argument); everything else goes to stderr.
#
# Cache: ${SHOAL_CACHE:-$HOME/.cache/shoal}/images/<key>/, key = sha256 over
# this script, the guest-agent sources, Cargo.lock, the built agent binary and
# the busybox version (tiny) / debootstrap suite, variant, includes and mirror
# (base). The debootstrap result itself is kept as a tarball under
# images/rootfs-<key>/ keyed only by suite, variant, includes, mirror and
# debootstrap version, so an agent or script change only re-packs.
#
# Environment: SHOAL_CACHE, SHOAL_DEBIAN_MIRROR (default: the Debian mirror in
# this machine's apt sources, else http://deb.debian.org/debian),
# CARGO_TARGET_DIR.
set -euo pipefail

log() { printf 'build-images: %s\n' "$*" >&2; }
die() {
	printf 'build-images: error: %s\n' "$*" >&2
	exit 1
}

what=${1:-all}
case "$what" in
tiny | base | all | vm) ;;
-h | --help)
	sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 0
	;;
*) die "unknown image '$what' (expected tiny, base, all or vm)" ;;
esac
want_tiny=0 want_base=0 want_vm=0
[[ $what == tiny || $what == all ]] && want_tiny=1
[[ $what == base || $what == all ]] && want_base=1
[[ $what == vm ]] && want_vm=1

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SCRIPT="$ROOT/scripts/build-images.sh"
CACHE=${SHOAL_CACHE:-$HOME/.cache/shoal}
IMAGES="$CACHE/images"
TARGET=x86_64-unknown-linux-musl

SUITE=bookworm
VARIANT=minbase
INCLUDES=python3,bash,ca-certificates
# Bump to force a fresh debootstrap (its tarball key ignores this script).
ROOTFS_REV=1

# Busybox applets linked in the tiny image (those this busybox lacks are skipped).
APPLETS="sh ash cat echo ls head tail dd sync mount umount reboot poweroff sleep
md5sum sha256sum hexdump od grep tr wc seq uname true false test [ printf env
id ps kill mkdir rmdir rm cp mv ln touch stat df du free sed awk cut sort uniq
tee xargs find dmesg date chmod chown hostname mknod readlink realpath basename
dirname timeout nproc cmp diff tar gzip gunzip vi less which yes"

# ---------------------------------------------------------------- cleanup
TMPS=()
cleanup() {
	local d m
	for d in "${TMPS[@]}"; do
		[[ -e $d ]] || continue
		# debootstrap mounts proc/sys inside its target; never rm through them.
		# shellcheck disable=SC2013
		for m in $(awk -v p="$d/" 'index($2, p) == 1 { print $2 }' /proc/mounts | sort -r); do
			umount -l "$m" 2>/dev/null || true
		done
		rm -rf --one-file-system "$d"
	done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Sets TMP to a fresh temp dir on the cache's filesystem (so the final rename
# is atomic). Not via $(...): the dir must be registered in this shell.
new_tmp() {
	mkdir -p "$IMAGES"
	TMP=$(mktemp -d "$IMAGES/.tmp.$1.XXXXXX") || die "cannot create a temp dir in $IMAGES"
	TMPS+=("$TMP")
}

# Atomically publish a finished temp dir as $2 (if another run won the race,
# keep theirs).
publish() {
	if ! mv -T "$1" "$2" 2>/dev/null; then
		[[ -d $2 ]] || die "cannot move $1 to $2"
		rm -rf "$1"
	fi
}

# ---------------------------------------------------------------- packages
ensure_packages() {
	local missing=() p
	for p in "$@"; do
		dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q 'install ok installed' ||
			missing+=("$p")
	done
	((${#missing[@]})) || return 0
	log "installing ${missing[*]}"
	[[ $(id -u) == 0 ]] || die "missing packages ${missing[*]} (run as root or install them)"
	export DEBIAN_FRONTEND=noninteractive
	if ! apt-get install -y "${missing[@]}" >&2; then
		apt-get update >&2 && apt-get install -y "${missing[@]}" >&2 ||
			die "apt-get install ${missing[*]} failed"
	fi
}

pkgs=()
((want_tiny)) && pkgs+=(busybox-static cpio erofs-utils)
((want_base)) && pkgs+=(debootstrap erofs-utils)
((want_vm)) && pkgs+=(debootstrap e2fsprogs qemu-utils)
ensure_packages "${pkgs[@]}"

# ---------------------------------------------------------------- agent
command -v cargo >/dev/null || die "cargo not found (install Rust via rustup)"
if command -v rustup >/dev/null && ! rustup target list --installed 2>/dev/null | grep -qx "$TARGET"; then
	log "rustup target add $TARGET"
	rustup target add "$TARGET" >&2 || die "rustup target add $TARGET failed"
fi
log "building shoal-agent ($TARGET)"
(cd "$ROOT" && cargo build --release -p guest-agent --target "$TARGET" >&2) ||
	die "cargo build of guest-agent failed"
target_dir=${CARGO_TARGET_DIR:-target}
[[ $target_dir == /* ]] || target_dir="$ROOT/$target_dir"
AGENT="$target_dir/$TARGET/release/shoal-agent"
[[ -x $AGENT ]] || die "agent binary not found at $AGENT"

# Common part of the image keys.
common_key=$(
	cd "$ROOT"
	{
		sha256sum "$SCRIPT" guest-agent/Cargo.toml Cargo.lock "$AGENT"
		find guest-agent/src -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
	} | sed "s#  $ROOT/#  #" | sha256sum | cut -c1-64
)

# Copies the agent into rootfs $1 as sbin/shoal-agent, stripped (smaller
# initramfs: every byte the guest kernel copies is slow under PVM).
install_agent() {
	install -D -m 0755 "$AGENT" "$1/sbin/shoal-agent"
	if command -v strip >/dev/null; then
		strip "$1/sbin/shoal-agent"
	fi
}

# make_erofs IMAGE DIR [mkfs.erofs options...]: a DAX-ready erofs image.
# No -z (uncompressed: DAX maps only plain files, and decompression is slow
# guest kernel work); the block size is the page size (4096), mkfs.erofs's
# default; -E noinline_data stores every file's last block as a whole block,
# so each regular file is EROFS_INODE_FLAT_PLAIN, the only layout Linux 6.1
# maps with DAX (tail-packed files would still go through the guest page
# cache). Then zero-padded to a multiple of 2 MiB.
make_erofs() {
	local img=$1 dir=$2
	shift 2
	mkfs.erofs --quiet -E noinline_data "$@" "$img" "$dir" >&2 || return 1
	truncate -s %2M "$img" || return 1
}

out_lines=()

# ---------------------------------------------------------------- tiny
build_tiny() {
	local bb_ver key dir tmp r a
	bb_ver=$(dpkg-query -W -f='${Version}' busybox-static)
	key=$(printf 'tiny\n%s\n%s\n' "$common_key" "$bb_ver" | sha256sum | cut -c1-32)
	dir="$IMAGES/tiny-$key"
	if [[ -f $dir/tiny.erofs && -f $dir/tiny.cpio && -f $dir/agent.erofs ]]; then
		log "tiny: cached in $dir"
	else
		log "tiny: building (busybox $bb_ver)"
		new_tmp tiny
		tmp=$TMP
		r="$tmp/root"
		mkdir -p "$r"/{bin,sbin,dev,proc,sys,tmp,run,root,etc,usr/bin,usr/sbin}
		chmod 1777 "$r/tmp"
		chmod 0700 "$r/root"
		install -m 0755 /bin/busybox "$r/bin/busybox"
		local have
		have=" $(/bin/busybox --list | tr '\n' ' ') "
		for a in $APPLETS; do
			[[ $have == *" $a "* ]] && ln -s busybox "$r/bin/$a"
		done
		install_agent "$r"
		ln -s sbin/shoal-agent "$r/init"
		printf 'root:x:0:0:root:/root:/bin/sh\n' >"$r/etc/passwd"
		printf 'root:x:0:\n' >"$r/etc/group"
		printf 'shoal\n' >"$r/etc/hostname"
		# The kernel opens /dev/console for init before anything is mounted.
		if [[ $(id -u) == 0 ]]; then
			mknod -m 0600 "$r/dev/console" c 5 1
		else
			log "tiny: not root, no /dev/console node (the agent reopens it after mounting devtmpfs)"
		fi
		make_erofs "$tmp/tiny.erofs" "$r" --all-root -T0 || die "mkfs.erofs failed for tiny"
		(cd "$r" && find . -mindepth 1 | LC_ALL=C sort |
			cpio -o -H newc -R 0:0 --reproducible --quiet) >"$tmp/tiny.cpio" ||
			die "cpio failed for tiny"
		rm -rf "$r"
		# The agent layer of container sandboxes: the agent and the mount
		# points it needs before it moves into the image's overlay.
		r="$tmp/agent"
		mkdir -p "$r"/{sbin,dev,proc,sys,tmp,run}
		chmod 1777 "$r/tmp"
		install_agent "$r"
		if [[ $(id -u) == 0 ]]; then
			mknod -m 0600 "$r/dev/console" c 5 1
		fi
		make_erofs "$tmp/agent.erofs" "$r" --all-root -T0 || die "mkfs.erofs failed for the agent layer"
		rm -rf "$r"
		publish "$tmp" "$dir"
		log "tiny: done"
	fi
	out_lines+=("tiny_erofs=$dir/tiny.erofs" "tiny_cpio=$dir/tiny.cpio" "tiny_agent_erofs=$dir/agent.erofs")
}

# ---------------------------------------------------------------- base
debian_mirror() {
	if [[ -n ${SHOAL_DEBIAN_MIRROR:-} ]]; then
		printf '%s\n' "$SHOAL_DEBIAN_MIRROR"
		return
	fi
	local m
	# First non-security .../debian URI in the deb822 or one-line sources.
	m=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list 2>/dev/null |
		grep -E '^[[:space:]]*(URIs:|deb[[:space:]])' | grep -oE 'https?://[^[:space:]]+' |
		grep -E '/debian/?$' | head -n1 || true)
	printf '%s\n' "${m:-http://deb.debian.org/debian}"
}

# Sets ROOTFS_TAR to the cached debootstrap tarball, making it if needed.
rootfs_tarball() {
	local mirror ds_ver key dir tmp t0
	mirror=$(debian_mirror)
	ds_ver=$(dpkg-query -W -f='${Version}' debootstrap)
	key=$(printf '%s\n' "$ROOTFS_REV" "$SUITE" "$VARIANT" "$INCLUDES" "$mirror" "$ds_ver" |
		sha256sum | cut -c1-32)
	dir="$IMAGES/rootfs-$key"
	if [[ -f $dir/rootfs.tar ]]; then
		log "base: debootstrap result cached in $dir"
	else
		[[ $(id -u) == 0 ]] || die "debootstrap needs root"
		log "base: debootstrap $SUITE ($VARIANT, +$INCLUDES) from $mirror (takes minutes)"
		new_tmp rootfs
		tmp=$TMP
		t0=$SECONDS
		if ! debootstrap --variant="$VARIANT" --include="$INCLUDES" "$SUITE" "$tmp/rootfs" "$mirror" >&2; then
			if [[ -f $tmp/rootfs/debootstrap/debootstrap.log ]]; then
				log "last lines of debootstrap.log:"
				tail -n 15 "$tmp/rootfs/debootstrap/debootstrap.log" >&2
			fi
			die "debootstrap $SUITE from $mirror failed (set SHOAL_DEBIAN_MIRROR to use another mirror)"
		fi
		log "base: debootstrap took $((SECONDS - t0)) s"
		tar -C "$tmp/rootfs" --numeric-owner --xattrs -cpf "$tmp/rootfs.tar" . ||
			die "tar of the debootstrap rootfs failed"
		rm -rf --one-file-system "$tmp/rootfs"
		publish "$tmp" "$dir"
	fi
	ROOTFS_TAR="$dir/rootfs.tar"
}

# Removes what a sandbox never needs from rootfs $1 and sets it up for Shoal.
strip_rootfs() {
	local r=$1
	rm -rf "$r"/var/cache/apt/* "$r"/var/lib/apt/lists/* "$r"/var/cache/debconf/*-old \
		"$r"/var/log/* "$r"/usr/share/doc/* "$r"/usr/share/man/* "$r"/usr/share/info/* \
		"$r"/usr/share/locale/* "$r"/usr/share/lintian "$r"/usr/share/linda \
		"$r"/debootstrap "$r"/dev/* "$r"/run/* "$r"/tmp/* "$r"/var/tmp/*
	# Locales: keep only C.UTF-8 (C itself is built into libc).
	if [[ -d $r/usr/lib/locale ]]; then
		find "$r/usr/lib/locale" -mindepth 1 -maxdepth 1 ! -name 'C.*' -exec rm -rf {} +
	fi
	# Keep later `apt-get install`s in the guest from bringing docs back.
	mkdir -p "$r/etc/dpkg/dpkg.cfg.d"
	cat >"$r/etc/dpkg/dpkg.cfg.d/01-shoal-nodoc" <<-'EOF'
		path-exclude=/usr/share/doc/*
		path-exclude=/usr/share/man/*
		path-exclude=/usr/share/info/*
		path-exclude=/usr/share/locale/*
	EOF
	install_agent "$r"
	[[ -e $r/sbin/init || -L $r/sbin/init ]] || ln -s shoal-agent "$r/sbin/init"
	mkdir -p "$r"/{dev,proc,sys,tmp,run,root}
	chmod 1777 "$r/tmp"
	mknod -m 0600 "$r/dev/console" c 5 1
	printf 'shoal\n' >"$r/etc/hostname"
	printf '127.0.0.1\tlocalhost\n127.0.1.1\tshoal\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$r/etc/hosts"
	: >"$r/etc/resolv.conf" # was copied from the build host
	: >"$r/etc/machine-id"
}

# Adds the unprivileged account `user` (uid/gid 1000, home /home/user,
# bash) to rootfs $1: the E2B SDK runs commands and file operations as
# `user` unless told otherwise.
add_default_user() {
	local r=$1
	grep -q '^user:' "$r/etc/passwd" && return 0
	printf 'user:x:1000:1000::/home/user:/bin/bash\n' >>"$r/etc/passwd"
	printf 'user:x:1000:\n' >>"$r/etc/group"
	[[ -f $r/etc/shadow ]] && printf 'user:*:19000:0:99999:7:::\n' >>"$r/etc/shadow"
	[[ -f $r/etc/gshadow ]] && printf 'user:*::\n' >>"$r/etc/gshadow"
	mkdir -p "$r/home/user"
	[[ -d $r/etc/skel ]] && cp -a "$r/etc/skel/." "$r/home/user/"
	chown -R 1000:1000 "$r/home/user"
	chmod 0750 "$r/home/user"
}

build_base() {
	local tar key dir tmp r
	rootfs_tarball
	tar=$ROOTFS_TAR
	key=$(printf 'base\n%s\n%s\n' "$common_key" "$(basename "$(dirname "$tar")")" |
		sha256sum | cut -c1-32)
	dir="$IMAGES/base-$key"
	if [[ -f $dir/base.erofs ]]; then
		log "base: cached in $dir"
	else
		[[ $(id -u) == 0 ]] || die "packing the base image needs root (file owners, device nodes)"
		log "base: packing base.erofs"
		new_tmp base
		tmp=$TMP
		r="$tmp/root"
		mkdir "$r"
		tar -C "$r" --numeric-owner --xattrs -xpf "$tar" || die "extracting $tar failed"
		strip_rootfs "$r"
		add_default_user "$r"
		# Real mtimes: python's .pyc files are validated against the .py mtime.
		make_erofs "$tmp/base.erofs" "$r" --preserve-mtime || die "mkfs.erofs failed for base"
		rm -rf --one-file-system "$r"
		publish "$tmp" "$dir"
		log "base: done"
	fi
	out_lines+=("base_erofs=$dir/base.erofs")
}

# The vm disk: the debootstrap result as base gets it, on ext4, with the
# agent as /usr/local/sbin/shoal-agent and as a systemd unit.
build_vm() {
	local tar key dir tmp r size
	rootfs_tarball
	tar=$ROOTFS_TAR
	size=${SHOAL_VM_DISK_SIZE:-2G}
	[[ $size =~ ^[0-9]+[MG]$ ]] || die "SHOAL_VM_DISK_SIZE=$size: give e.g. 2G or 512M"
	key=$(printf 'vm\n%s\n%s\n%s\n' "$common_key" "$(basename "$(dirname "$tar")")" "$size" |
		sha256sum | cut -c1-32)
	dir="$IMAGES/vm-$key"
	if [[ -f $dir/vm.qcow2 ]]; then
		log "vm: cached in $dir"
	else
		[[ $(id -u) == 0 ]] || die "making the vm disk needs root (file owners, device nodes)"
		log "vm: making vm.qcow2 ($size)"
		new_tmp vm
		tmp=$TMP
		r="$tmp/root"
		mkdir "$r"
		tar -C "$r" --numeric-owner --xattrs -xpf "$tar" || die "extracting $tar failed"
		strip_rootfs "$r"
		add_default_user "$r"
		install -D -m 0755 "$r/sbin/shoal-agent" "$r/usr/local/sbin/shoal-agent"
		mkdir -p "$r/etc/systemd/system/multi-user.target.wants"
		cat >"$r/etc/systemd/system/shoal-agent.service" <<-'EOF'
			[Unit]
			Description=Shoal guest agent (serves the host over the virtio-serial port org.shoal.agent)
			After=local-fs.target

			[Service]
			ExecStart=/usr/local/sbin/shoal-agent --guest
			Restart=always
			RestartSec=1
			# The host waits for SHOAL-INIT-READY on the first serial port.
			StandardOutput=journal+console
			StandardError=journal+console
			TTYPath=/dev/ttyS0

			[Install]
			WantedBy=multi-user.target
		EOF
		ln -sf ../shoal-agent.service "$r/etc/systemd/system/multi-user.target.wants/shoal-agent.service"
		printf 'LABEL=shoal-root / ext4 errors=remount-ro 0 1\n' >"$r/etc/fstab"
		mkfs.ext4 -q -F -L shoal-root -d "$r" "$tmp/vm.raw" "$size" >&2 ||
			die "mkfs.ext4 -d failed for the vm disk"
		rm -rf --one-file-system "$r"
		qemu-img convert -q -f raw -O qcow2 "$tmp/vm.raw" "$tmp/vm.qcow2" >&2 ||
			die "qemu-img convert failed for the vm disk"
		rm -f "$tmp/vm.raw"
		publish "$tmp" "$dir"
		log "vm: done"
	fi
	out_lines+=("vm_qcow2=$dir/vm.qcow2")
}

# One build at a time per cache (a concurrent caller waits, then finds the
# images cached).
mkdir -p "$IMAGES"
exec 9>"$IMAGES/.lock"
if ! flock -n 9; then
	log "waiting for another build-images.sh run to finish"
	flock 9
fi

((want_tiny)) && build_tiny
((want_vm)) && build_vm
((want_base)) && build_base
printf '%s\n' "${out_lines[@]}"
