# Sourced first by each script a GPU host runs (scripts/gpu_tests.sh, scripts/gpu_piece.sh), from the checkout's
# root, with the script's name in $who: takes the commit of .whl/head.bundle (scripts/device_head.sh) when carried,
# since the host's .git may be an older call's and its records would name that commit and say dirty; says which
# commit it is at, and when the checkout is not clean; installs the carried wheels (.whl/, scripts/device_wheels.sh)
# where Snakemake is missing (the workflow needs it, and so do the tests, which import the package's planning
# code); makes `python` name python3 where it is missing.
if [ -f .whl/head.bundle ]; then  # the commit the files came from, where .git is older
  git fetch -q .whl/head.bundle HEAD && git reset -q FETCH_HEAD \
    || { echo "$who: cannot take the commit of .whl/head.bundle" >&2; exit 2; }
  echo "$who: took the commit of .whl/head.bundle"
fi
echo "$who: at commit $(git log -1 --format=%H 2>/dev/null || echo unknown)"  # what its records will name
changed=$(git status --porcelain 2>/dev/null | head -5 | tr '\n' ' ')
[ -z "$changed" ] || echo "$who: the checkout is not clean here ($changed); records made now say dirty" >&2
if ! python3 -c "import snakemake" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "$who: Snakemake is missing and the carried wheels (.whl/) do not install" >&2; exit 2; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
fi
command -v python >/dev/null || { mkdir -p /tmp/pybin && ln -sf "$(command -v python3)" /tmp/pybin/python \
  && export PATH=/tmp/pybin:$PATH; }
