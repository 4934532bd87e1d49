#!/usr/bin/env bash
# Every commit subject since the rule was enforced is at most 72 characters
# (git's own tools, shortlogs and most web views cut there).
#   tools/check-subjects.sh           check HEAD's history since $SINCE
#   tools/check-subjects.sh FILE      check one message (the commit-msg hook:
#                                     ln -s ../../tools/check-subjects.sh .git/hooks/commit-msg)
set -euo pipefail
MAX=72
SINCE=9c5e1752f8d0bea56e326a53c6a6fd6159ecd8b2  # the last commit before the rule
too_long() { awk -v max="$MAX" 'length($0) > max { printf "%d characters: %s\n", length($0), $0; bad = 1 } END { exit bad }'; }
if [ $# -eq 1 ]; then
    sed -n '/^[^#]/{p;q}' "$1" | too_long || { echo "commit subject over $MAX characters" >&2; exit 1; }
    exit 0
fi
cd "$(dirname "$0")/.."
if ! git cat-file -e "$SINCE^{commit}" 2>/dev/null; then
    echo "check-subjects: $SINCE is not in this clone's history (shallow?): nothing checked"
    exit 0
fi
git log --no-merges --format=%s "$SINCE..HEAD" | too_long || { echo "check-subjects: subjects over $MAX characters (git commit --amend, or rebase -i to reword)" >&2; exit 1; }
