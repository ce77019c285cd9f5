#!/usr/bin/env bash
# Builds the distributed test cluster's server: a copy of the PostgreSQL 16 tree that the
# pgserver wheel ships, with Citus and pgvector 0.8 compiled into it from the release tarballs
# in ../shared/vendor (read in place, checked against the sha256 of vendor/README.md). The
# copy lives in .cluster/pgserver/pginstall (ignored), beside a copy of the wheel's bundled
# libraries (.cluster/pgserver.libs, where the binaries' relative rpath looks); the wheel's own
# tree is never written. A stamp file makes a second run free.
#   usage: .ci/build-cluster.sh PYTHON [VENDOR_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${1:?usage: build-cluster.sh PYTHON [VENDOR_DIR]}
VENDOR=${2:-../shared/vendor}
OUT=.cluster
PG=$OUT/pgserver/pginstall
STAMP=$PG/.built-citus-13.2.2-pgvector-0.8.6
CITUS=citus-13.2.2.tar.gz
CITUS_SHA=dd2453caec20a830e5e63f1def5c5a98cb6f57ae510407cdcd800916fcdab430
PGVECTOR=pgvector-0.8.6.tar.gz
PGVECTOR_SHA=5743dac39fdfa740533cf95e71b033bd5513b71dda194b3cf19464ccbf76f3fb

# Citus links libpq by the tree's absolute path: a tree built elsewhere (a moved clone) is rebuilt
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(pwd)" ]; then exit 0; fi
if [ ! -f "$VENDOR/$CITUS" ] || [ ! -f "$VENDOR/$PGVECTOR" ]; then
  echo "cluster-build: no $VENDOR/$CITUS or $VENDOR/$PGVECTOR; the Citus tests will skip"
  exit 0
fi
echo "$CITUS_SHA  $VENDOR/$CITUS" | sha256sum -c --quiet
echo "$PGVECTOR_SHA  $VENDOR/$PGVECTOR" | sha256sum -c --quiet

SITE=$("$PYTHON" -c 'import os, pgserver; print(os.path.dirname(os.path.dirname(pgserver.__file__)))')
rm -rf "$OUT/pgserver" "$OUT/pgserver.libs" "$OUT/src"
mkdir -p "$OUT/src" "$OUT/pgserver"
cp -a "$SITE/pgserver/pginstall" "$PG"
if [ -d "$SITE/pgserver.libs" ]; then cp -a "$SITE/pgserver.libs" "$OUT/pgserver.libs"; fi
PGC=$(pwd)/$PG/bin/pg_config
# pg_config reports paths relative to where it lies, so the copy builds and installs into itself
case "$("$PGC" --pkglibdir)" in "$(pwd)/$PG"/*) ;; *) echo "cluster-build: $PGC does not point into its copy" >&2; exit 1 ;; esac

tar xzf "$VENDOR/$CITUS" -C "$OUT/src"
tar xzf "$VENDOR/$PGVECTOR" -C "$OUT/src"
(cd "$OUT/src/citus-13.2.2" && ./configure -q PG_CONFIG="$PGC" --without-libcurl --without-lz4 --without-zstd \
  && make -s -j"$(nproc)" && make -s install) >"$OUT/citus-build.log" 2>&1 \
  || { tail -40 "$OUT/citus-build.log" >&2; exit 1; }
(cd "$OUT/src/pgvector-0.8.6" && make -s PG_CONFIG="$PGC" OPTFLAGS="" && make -s PG_CONFIG="$PGC" install) \
  >"$OUT/pgvector-build.log" 2>&1 || { tail -40 "$OUT/pgvector-build.log" >&2; exit 1; }
rm -rf "$OUT/src"
pwd >"$STAMP"
echo "cluster-build: Citus 13.2.2 and pgvector 0.8.6 built into $PG"
