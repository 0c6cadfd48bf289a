#!/bin/sh
# Lays out the runtime filesystem of the rapidfs image under DEST: the binary, the shared
# libraries it links (as ldd resolves them, the dynamic loader included) and the CA
# certificates, nothing else. The Dockerfile's build stage and tests/deploy_files.rs both call
# it, so the layout that is tested is the layout that ships.
#
# usage: docker/rootfs.sh BINARY DEST
set -eu
if [ $# -ne 2 ]; then
    echo "usage: $0 BINARY DEST" >&2
    exit 2
fi
bin=$1
dest=$2
install -D -m 0755 "$bin" "$dest/usr/local/bin/rapidfs"
# "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" and "/lib64/ld-linux-x86-64.so.2 (0x...)".
ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' |
    while read -r lib; do
        # Copy the file itself (not a symlink) to the path the binary asks for.
        install -D -m 0755 "$(readlink -f "$lib")" "$dest$lib"
    done
install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$dest/etc/ssl/certs/ca-certificates.crt"
