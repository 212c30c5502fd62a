#!/usr/bin/env bash
# The console's JavaScript (ES modules, each `// @ts-check` with JSDoc
# types) checked by TypeScript's compiler, pinned, emitting nothing: there
# is no build step, the files are served as written. TypeScript goes into
# .node-console-types (git-ignored) when missing or at another version.
# Skipped where Node.js is not installed.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v node > /dev/null; then
  echo "console type check: skipped (no node)"
  exit 0
fi

version=5.9.3
dir=.node-console-types
if [ "$(node -p 'require("./'$dir'/node_modules/typescript/package.json").version' 2>/dev/null)" != "$version" ]; then
  npm install --silent --no-audit --no-fund --save-exact --prefix "$dir" "typescript@$version" > /dev/null
fi

# Strict, but for null checks (a lookup of an element the page always has
# would need a cast each time) and `unknown` in catch clauses.
node "$dir/node_modules/typescript/bin/tsc" --noEmit --allowJs --checkJs \
  --strict --strictNullChecks false --useUnknownInCatchVariables false \
  --target es2022 --module es2022 --moduleResolution bundler --lib es2022,dom,dom.iterable \
  crates/service/src/api/console/*.js
echo "console type check: ok"
