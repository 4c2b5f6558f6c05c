#!/usr/bin/env bash
# Builds fio, the baseline of `vfabric-bench storage`, small enough to carry to the GPU machine (which has no fio
# and no internet; Debian's fio links ceph, gluster and RDMA libraries, 84 MB with them): Debian's source of fio
# 3.33, checked against its SHA-256, configured without those engines (io_uring, sync and the others in fio
# itself stay), linking only libc, libm and libz. Cached in target/fio-3.33.
#
#   bash scripts/fio-build.sh DEST    # copies the binary to DEST (a file)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:?usage: fio-build.sh DEST}
src=target/fio-3.33
url=http://deb.debian.org/debian/pool/main/f/fio/fio_3.33.orig.tar.gz
sum=d2410e13e0f379d061d077cc5ae325835bb7c6186aa7bafc1df954cbc9b014fc
if [ ! -x "$src/fio" ]; then
    mkdir -p target
    tarball=target/fio_3.33.orig.tar.gz
    [ -f "$tarball" ] || curl -fsSL -o "$tarball" "$url"
    echo "$sum  $tarball" | sha256sum -c --quiet
    rm -rf "$src"
    tar -xzf "$tarball" -C target
    (
        cd "$src"
        ./configure --disable-numa --disable-rdma --disable-rados --disable-rbd --disable-http --disable-gfapi \
            --disable-libnfs --disable-pmem --disable-native --disable-xnvme --disable-libzbc --disable-tcmalloc \
            --disable-dfs > configure.log
        make -j"$(nproc)" fio > make.log
    )
fi
cp "$src/fio" "$dest"
strip "$dest" 2>/dev/null || true
