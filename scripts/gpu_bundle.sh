#!/usr/bin/env bash
# Gathers here, where Debian's package registry answers, the build dependencies a GPU machine without
# one may lack (Eigen, nlohmann-json, Boost.Program_options and its runtime library, Catch2, zlib), and
# unpacks them into one folder that travels with the run (docs/gpu.md). scripts/gpu_run.sh builds
# against it there. The folder is under build-deps/, which git ignores (/build*/ in .gitignore).
#   scripts/gpu_bundle.sh [DEST]        (default: build-deps/gpu)
# Boost's headers are cut down to what <boost/program_options.hpp> includes (measured here with every
# compiler present, plus whole small sub-libraries), so the folder stays a few tens of MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h|--help) sed -n '2,8p' "$0"; exit 0 ;; esac
dest=${1:-build-deps/gpu}

if [ "$(id -u)" -eq 0 ]; then as_root=(); elif command -v sudo >/dev/null 2>&1; then as_root=(sudo); else as_root=(); fi
echo "gpu_bundle: apt-get update"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq

# The versioned Boost packages behind the meta package (1.74 on Debian 12).
po_dev=$(apt-cache depends libboost-program-options-dev | awk '/Depends: libboost-program-options[0-9.]+-dev/ {print $2; exit}')
[ -n "$po_dev" ] || { echo "gpu_bundle: cannot resolve libboost-program-options-dev's versioned package" >&2; exit 1; }
boost_ver=${po_dev#libboost-program-options}
boost_ver=${boost_ver%-dev}
packages=(libeigen3-dev nlohmann-json3-dev catch2 zlib1g-dev zlib1g libboost-program-options-dev "$po_dev"
          "libboost-program-options${boost_ver}.0" "libboost${boost_ver}-dev")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/debs" "$work/root"
echo "gpu_bundle: apt-get download ${packages[*]}"
(cd "$work/debs" && apt-get download -qq "${packages[@]}" 2>&1 | grep -v "couldn't be accessed by user '_apt'" || true)
for p in "${packages[@]}"; do
  ls "$work/debs/${p}"_*.deb >/dev/null 2>&1 || { echo "gpu_bundle: $p was not downloaded" >&2; exit 1; }
done
for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$work/root"; done
rm -rf "$work/root/usr/share/doc" "$work/root/usr/share/man" "$work/root/usr/share/lintian"

# Boost: only the headers program_options needs. The include closure is measured with each compiler
# here and two language standards; the small sub-libraries it touches, and those whose choice of files
# depends on the compiler (config, type_traits, preprocessor), are kept whole.
inc="$work/root/usr/include"
echo '#include <boost/program_options.hpp>' >"$work/probe.cpp"
: >"$work/closure"
for cxx in g++ clang++; do
  command -v "$cxx" >/dev/null 2>&1 || continue
  for std in c++17 c++20; do
    "$cxx" -std=$std -M "$work/probe.cpp" -I"$inc" | tr ' \\' '\n\n' | grep "^$inc/boost/" >>"$work/closure" || true
  done
done
sort -u -o "$work/closure" "$work/closure"
[ -s "$work/closure" ] || { echo "gpu_bundle: no compiler could measure Boost's include closure" >&2; exit 1; }
mkdir -p "$work/boost"
while read -r f; do
  rel=${f#"$inc/"}
  mkdir -p "$work/boost/$(dirname "$rel")"
  cp -p "$f" "$work/boost/$rel"
done <"$work/closure"
for d in $(sed "s|^$inc/boost/||" "$work/closure" | awk -F/ 'NF > 1 {print $1}' | sort -u) config type_traits preprocessor; do
  if [ "$d" = config ] || [ "$d" = type_traits ] || [ "$d" = preprocessor ] ||
     [ "$(du -sk "$inc/boost/$d" | cut -f1)" -lt 1024 ]; then
    cp -rp "$inc/boost/$d" "$work/boost/boost/"
  fi
done
rm -rf "$inc/boost"
mv "$work/boost/boost" "$inc/boost"

# Absolute symbolic links (zlib's libz.so -> /lib/...) would point outside the folder: make them relative.
while read -r link; do
  target=$(readlink "$link")
  case "$target" in
    /*) [ -e "$work/root$target" ] && ln -sfn "$(realpath --relative-to="$(dirname "$link")" "$work/root$target")" "$link" ;;
  esac
done < <(find "$work/root" -type l)

{
  echo "# gradscale GPU build dependencies, gathered by scripts/gpu_bundle.sh on $(date -u +%Y-%m-%d) from:"
  for deb in "$work"/debs/*.deb; do echo "$(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version)"; done
} >"$work/root/MANIFEST"

rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$work/root" "$dest"
echo "gpu_bundle: $(du -sh "$dest" | cut -f1) in $dest (carry it with the run; scripts/gpu_run.sh uses it)"
