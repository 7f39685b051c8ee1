# Every C++ file of the tree is formatted as .clang-format says (Debian's
# clang-format, which setup installs): `clang-format --dry-run --Werror`
# over the files git tracks. A file that is not, and a check that cannot run,
# fail naming the file or the reason. Then a mis-formatted copy of a source
# must be caught (the check can fail).
# To format after an edit: clang-format -i FILE (or the list below).
source "$(dirname "$0")/lib.sh" "$@"

command -v clang-format >/dev/null || { fail "clang-format is not installed (scripts/setup.sh installs it)"; finish; }
git -C "$SOURCE_DIR" rev-parse --git-dir >/dev/null 2>&1 || { fail "$SOURCE_DIR is not a git checkout: no file list"; finish; }
git -C "$SOURCE_DIR" ls-files -co --exclude-standard -- '*.h' '*.cpp' '*.cu' '*.cuh' \
  | grep -v '^third_party/' >files.txt
while read -r f; do [ -f "$SOURCE_DIR/$f" ] && echo "$SOURCE_DIR/$f"; done <files.txt >paths.txt
n=$(wc -l <paths.txt)
[ "$n" -gt 100 ] || fail "only $n C++ files found under $SOURCE_DIR"
(cd "$SOURCE_DIR" && xargs clang-format --dry-run --Werror) <paths.txt >format.txt 2>&1
expect_status 0 $? "clang-format --dry-run --Werror over $n files"
[ -s format.txt ] && { echo "files not formatted (clang-format -i them):"; grep -o "^[^:]*:" format.txt | sort -u | sed 's/^/    /'; }

cp "$SOURCE_DIR/.clang-format" .
cp "$SOURCE_DIR/src/core/error.cpp" bad.cpp
sed -i 's/^  throw /      throw   /' bad.cpp
clang-format --dry-run --Werror bad.cpp >bad.txt 2>&1
expect_status 1 $? "a mis-formatted file is caught"
expect_contains bad.txt "bad.cpp:" "the mis-formatted file is named"
finish
