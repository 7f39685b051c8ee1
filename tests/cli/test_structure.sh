# The house rules of docs/architecture.md, checked on the tree itself by
# scripts/structure_map.py: includes run only from a higher module down to a
# lower one, and each header is implemented inside its own module's folder.
# Then a copy of the tree with one upward include (config including learner)
# and one header implemented elsewhere must fail, naming both.
source "$(dirname "$0")/lib.sh" "$@"

python3 "$SOURCE_DIR/scripts/structure_map.py" "$SOURCE_DIR" >map.txt 2>&1
expect_status 0 $? "the tree follows its layers"
expect_contains map.txt "layer 1  config     -> core" "config is the ground floor (it includes only core)"
expect_contains map.txt "layer 1  telemetry  -> core" "telemetry includes only core"
sed 's/^/    | /' map.txt

mkdir tree
cp -r "$SOURCE_DIR/include" "$SOURCE_DIR/src" "$SOURCE_DIR/scripts" tree/
sed -i '0,/^#include "moerl\/config\/schema.h"/s//#include "moerl\/config\/schema.h"\n#include "moerl\/learner\/learner.h"/' \
  tree/src/config/config.cpp
mv tree/src/storage/checksum.cpp tree/src/comm/checksum.cpp
python3 tree/scripts/structure_map.py tree >bad.txt 2>&1
expect_status 1 $? "an upward include and a displaced implementation are refused"
expect_contains bad.txt "src/config/config.cpp:" "the upward include's file is named"
expect_contains bad.txt "config (layer 1) includes learner (layer 6): includes must run downwards" "the rule is said"
expect_contains bad.txt "include/moerl/storage/checksum.h: implemented in src/comm/checksum.cpp, outside src/storage/" \
  "the displaced implementation is named"
finish
