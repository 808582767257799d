# Sourced by docker/local-base.sh and emulator/sam-base-image.sh (from the repository root): a minimal Debian root
# filesystem made by debootstrap from the mirror apt already uses, kept as a tarball under a hash of what goes into
# it. Needs root (debootstrap, chroot) and debootstrap. DEBIAN_MIRROR overrides the mirror. The sourcing script
# defines build_rootfs DIR (usually debootstrap_minimal plus its own layers).

local_cas=/usr/local/share/ca-certificates

apt_mirror() {
    # The first Debian URI that apt is configured with, deb822 (*.sources) or one-line (*.list) format.
    local uri
    uri=$(grep -hs -A3 '^Types:.*deb' /etc/apt/sources.list.d/*.sources \
        | grep -m1 -o 'URIs:[[:space:]]*[^[:space:]]*/debian/\?$' | awk '{print $2}' || true)
    [ -n "$uri" ] || uri=$(grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
        | awk '$2 ~ /\/debian\/?$/ {print $2; exit}' || true)
    echo "${uri:-http://deb.debian.org/debian}"
}
mirror=${DEBIAN_MIRROR:-$(apt_mirror)}

debootstrap_minimal() {  # DIR SUITE PACKAGES: a minbase SUITE with PACKAGES (comma-separated) in DIR
    debootstrap --variant=minbase --include="$3" "$2" "$1" "$mirror" >&2
    # What an image does not need: package lists and downloaded .debs, documentation, locales but C.
    rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/usr/share/doc/* "$1"/usr/share/man/* \
        "$1"/usr/share/info/* "$1"/var/log/* "$1"/tmp/*
    find "$1"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
    # The certificate authorities this machine adds to Debian's (a TLS-inspecting proxy's, a company's): pip in
    # the image then reaches PyPI the way pip here does.
    if compgen -G "$local_cas/*.crt" >/dev/null; then
        cp "$local_cas"/*.crt "$1"/usr/local/share/ca-certificates/
        chroot "$1" update-ca-certificates >&2
    fi
}

rootfs_key() {  # TEXT: the cache key of a root filesystem: TEXT (what decides it), the recipes, the local CAs
    { echo "$*"; declare -f debootstrap_minimal build_rootfs; cat "$local_cas"/*.crt 2>/dev/null || true; } \
        | sha256sum | cut -c1-12
}

cached_rootfs() {  # TARBALL LABEL: build_rootfs into a tarball at TARBALL unless one is there already
    [ ! -s "$1" ] || return 0
    mkdir -p "$(dirname "$1")"
    # Private names until the final rename: two runs at once each build their own and one rename wins.
    rootfs=$(mktemp -d "$(dirname "$1")/rootfs.XXXXXX")
    partial=$(mktemp "$1.XXXXXX")
    trap 'rm -rf --one-file-system "$rootfs" "$partial"' EXIT
    echo "$2: debootstrap into $rootfs from $mirror" >&2
    build_rootfs "$rootfs"
    tar --numeric-owner -C "$rootfs" -cf "$partial" .
    mv "$partial" "$1"
}
