"""The re-audit's output and command-line cases.

Outputs: every output flag of the analysis commands x a target a user might give it: ``-``, the
input itself, the input under another name (symlink, hardlink, ``./`` spelling), another
output's path, a missing folder, a file used as a folder, ``/dev/full``, ``/dev/null``, a
``/proc`` path, a read-only folder (run as uid 65534), an existing file, an existing folder, an
empty name. What must be refused is marked (``expect_refusal``): the input, its aliases, one
file for two flags; everything else may be written or refused in one line, never half.

Subcommands: every command's ``--help``, and the flags a user gets wrong: missing values, bad
numbers, out-of-range values, unknown names, missing or unreadable side files.
"""

from __future__ import annotations

from pathlib import Path

from reaudit_run import Case

# command -> (argv before the output flags, {flag: stdout kind for "-"}), {INPUT} / {PEER} / {REPORT} filled in
OUTPUT_FLAGS = {
    "analyze": (["analyze", "{INPUT}"], {"--json": "json", "-o": "json"}),
    "report": (["report", "{INPUT}"], {"-o": "text", "--json": "json", "--html": "text"}),
    "categories": (["categories", "{INPUT}"], {"-o": "json"}),
    "check": (["check", "{REPORT}"], {"--json": "json"}),
    "compare": (["compare", "{INPUT}", "{PEER}"], {"-o": "text", "--json": "json"}),
    "export": (["export", "perfetto", "{INPUT}"], {"-o": "json"}),
    "ranks": (["ranks", "{RANKS}", "--workers", "1"], {"-o": "text", "--json": "json"}),
}
EXT = {"json": ".json", "text": ".md"}


def _fill(argv: list[str], env: dict[str, str]) -> list[str]:
    return [env.get(a.strip("{}"), a) if a.startswith("{") else a for a in argv]


def output_cases(env: dict[str, str]) -> list[Case]:
    """``env``: INPUT (a Kineto trace), PEER, REPORT (a written report), RANKS (a rank folder)."""
    out = []
    for cmd, (base, flags) in OUTPUT_FLAGS.items():
        argv0 = _fill(base, env)
        inp = env["RANKS"] if cmd == "ranks" else env["REPORT"] if cmd == "check" else env["INPUT"]
        inputs = [p for p in (env["INPUT"], env["PEER"], env["REPORT"], env["RANKS"]) if p in argv0]
        extra = ["--format", "json"] if cmd == "analyze" else []
        for flag, kind in flags.items():
            ext = ".json.gz" if cmd == "export" else EXT[kind]
            others = [f for f in flags if f != flag]
            sibling = [others[0], f"other{EXT[flags[others[0]]]}"] if others else []
            if cmd == "analyze" and flag == "-o":
                sibling = []
            targets: list[tuple[str, str, list, dict]] = [
                ("dash", "-", [], {"dash": kind}),
                ("the-input", inp, [], {"expect": True}),
                ("symlink-to-input", "alias" + ext, [("symlink", inp, "alias" + ext)], {"expect": True}),
                ("hardlink-to-input", "hard" + ext, [("hardlink", inp, "hard" + ext)], {"expect": True})
                if Path(inp).is_file() else None,
                ("dot-spelling-of-input", str(Path(inp).parent / "." / Path(inp).name), [], {"expect": True}),
                ("missing-folder", "new/sub/out" + ext, [], {}),
                ("file-as-folder", "afile/out" + ext, [("write", "afile", "x")], {}),
                ("dev-full", "/dev/full", [], {}),
                ("dev-null", "/dev/null", [], {}),
                ("proc", "/proc/self/out" + ext, [], {}),
                ("read-only-folder", "ro/out" + ext, [("mkdir", "ro"), ("chmod", "ro", 0o555)], {"nobody": True}),
                ("existing-file", "old" + ext, [("write", "old" + ext, "old\n")], {}),
                ("existing-folder", "adir", [("mkdir", "adir")], {}),
                ("empty-name", "", [], {}),
                ("trailing-slash", "out/", [], {}),
            ]
            if sibling:
                targets.append(("same-as-other-output", sibling[1], [], {"expect": True, "also": sibling}))
                targets.append(("both-on-stdout", "-", [], {"expect": True, "also": [sibling[0], "-"]}))
            for t in targets:
                if t is None:
                    continue
                tname, target, prep, opt = t
                if cmd == "ranks" and tname == "hardlink-to-input":
                    continue
                also = opt.get("also", [])
                argv = [*argv0, *extra, flag, target, *also]
                own_md = cmd == "report" and flag != "-o" and "-o" not in also
                if own_md:
                    argv += ["-o", "r.md"]
                written = [target] + ([also[1]] if also and also[1] != "-" else []) + (["r.md"] if own_md else [])
                written = [w for w in written if w and w != "-" and not w.startswith("/dev/")
                           and w not in (inp, "adir") and "alias" not in w and "hard" not in w and "/./" not in w]
                out.append(Case("outputs", f"outputs/{cmd}/{flag.lstrip('-')}/{tname}", argv,
                                inputs=list(inputs) + ([target] if tname in ("symlink-to-input", "hardlink-to-input")
                                                       else []),
                                outputs=written, dash=opt.get("dash"), prepare=prep,
                                must_write=[target] if tname in ("empty-name", "trailing-slash", "missing-folder",
                                                                  "existing-file") else [],
                                as_nobody=bool(opt.get("nobody")), expect_refusal=bool(opt.get("expect"))))
    # the demo's folder
    for tname, target, prep in [("file", "afile", [("write", "afile", "x")]), ("proc", "/proc/self/demo", []),
                                ("dev-full", "/dev/full", []), ("read-only", "ro/d", [("mkdir", "ro"),
                                                                                     ("chmod", "ro", 0o555)]),
                                ("existing-folder", "old", [("write", "old/keep.txt", "keep")]),
                                ("missing", "new/demo", []), ("empty", "", [])]:
        out.append(Case("outputs", f"outputs/demo/output-dir/{tname}", ["demo", "--output-dir", target],
                        prepare=prep, must_write=[f"{target}/report.md"] if tname in ("missing", "empty") else [],
                        as_nobody=tname == "read-only", inputs=["old/keep.txt"] if tname ==
                        "existing-folder" else []))
    # stdout itself unwritable
    for cmd in ("analyze", "categories"):
        out.append(Case("outputs", f"outputs/{cmd}/stdout/dev-full", [cmd, env["INPUT"]], stdout_path="/dev/full",
                        inputs=[env["INPUT"]]))
    return out


def subcommand_cases(env: dict[str, str]) -> list[Case]:
    """Help of every command, and wrong flags."""
    k, peer, rep, ranks = env["INPUT"], env["PEER"], env["REPORT"], env["RANKS"]
    helps = [["--help"], ["--version"], [], ["nosuchcommand"]]
    for cmd in ("analyze", "report", "demo", "categories", "check", "compare", "export", "ranks", "capture", "bench",
                "eval", "serve", "load"):
        helps.append([cmd, "--help"])
    helps += [["export", "perfetto", "--help"], ["capture", "torch", "--help"], ["capture", "nsys", "--help"],
              ["capture", "ncu", "--help"], ["bench", "llama", "--help"], ["bench", "attention-decode", "--help"],
              ["bench", "fp8", "--help"], ["bench", "moe", "--help"], ["eval", "ppl", "--help"],
              ["export"], ["export", "nosuch"], ["capture"], ["capture", "nosuch"], ["bench"], ["bench", "nosuch"],
              ["eval"], ["eval", "nosuch"]]
    bad: list[list[str]] = []
    common = [["--taxonomy", "nope"], ["--rules", "missing.toml"], ["--rules", "adir"], ["--rules", "bad.toml"],
              ["--rules", "empty.toml"], ["--rules", "wrong.toml"], ["--peaks", "missing.toml"],
              ["--peaks", "bad.toml"], ["--peaks", "wrong.toml"], ["--peaks", "adir"],
              ["-k", "abc"], ["-k", "0"], ["-k", "-1"], ["-k", "inf"], ["-k", "nan"], ["-k", "1e400"],
              ["--window", "abc"], ["--window", "5:1"], ["--window", ":"], ["--window", "-1:"],
              ["--window", "1e400:"], ["--window", "nan:1"], ["--window", "1000000:"],
              ["--steps", "a:b"], ["--steps", "5:1"], ["--steps", "99:100"], ["--steps", "1:"], ["--steps", "-3:-1"],
              ["--steady-state", "--window", "0:1"], ["--bogus"], ["--rules"], ["--peaks"]]
    for c in ("analyze", "report"):
        tail = ["-o", "r.md"] if c == "report" else []
        for flags in common:
            bad.append([c, k, *flags, *tail])
    for flags in (["--table", "nope"], ["--format", "csv"], ["--format", "nope"], ["--table", "kernels", "--format",
                  "csv"], ["--table", "gaps", "--format", "markdown"], ["--table", "collectives"], ["--table",
                  "osrt_sum", "--format", "json"], ["--format", "markdown"], ["-o"], ["--json"]):
        bad.append(["analyze", k, *flags])
    bad += [["analyze"], ["analyze", "missing.json"], ["analyze", ""], ["analyze", "-"], ["analyze", "adir"],
            ["analyze", k, peer], ["analyze", k, k], ["report", k, "--goal", "", "-o", "r.md"],
            ["report", k, "--question", "", "-o", "r.md"], ["report", k, "--question", "why?" * 5000, "-o", "r.md"],
            ["report", k, "-o"], ["report"], ["report", "missing.json"],
            ["compare", k], ["compare"], ["compare", k, "missing.json"], ["compare", k, k],
            ["compare", k, peer, "--top", "0"], ["compare", k, peer, "--top", "-1"], ["compare", k, peer, "--top",
                                                                                          "abc"],
            ["compare", k, peer, "--top", "100000000000000000000"], ["compare", k, peer, "--gate", "abc"],
            ["compare", k, peer, "--gate", "-5"], ["compare", k, peer, "--gate", "nan"],
            ["compare", k, peer, "--gate", "inf"], ["compare", k, peer, "--gate-metric", "nope=5"],
            ["compare", k, peer, "--gate-metric", "iteration=abc"], ["compare", k, peer, "--gate-metric", "iteration"],
            ["compare", k, peer, "--gate-metric", "=5"], ["compare", k, peer, "--label-a", ""],
            ["compare", k, peer, "--steps", "5:1"], ["compare", k, peer, "--window", "abc"],
            ["compare", k, ranks], ["compare", k, peer, "--rules", "bad.toml"],
            ["export", "perfetto"], ["export", "perfetto", "missing.json"], ["export", "perfetto", k, "--taxonomy",
                                                                             "nope"],
            ["ranks"], ["ranks", ranks, "--workers", "0"], ["ranks", ranks, "--workers", "-1"],
            ["ranks", ranks, "--workers", "abc"], ["ranks", "nomatch*.json"], ["ranks", k, "--workers", "1"],
            ["ranks", ranks, "--dask", "tcp://127.0.0.1:1", "--workers", "1"], ["ranks", "adir"],
            ["check"], ["check", "missing.md"], ["check", k], ["check", "empty.md"], ["check", "adir"],
            ["check", rep, rep], ["categories", "missing.json"], ["categories", "adir"],
            ["categories", k, "--taxonomy", "nope"], ["categories", k, "--rules", "bad.toml"],
            ["demo", "--output-dir"], ["capture", "torch"], ["capture", "torch", "--", "nosuchprog"],
            ["capture", "torch", "--", "python3", "missing.py"], ["capture", "torch", "--count", "-1", "--", "true"],
            ["capture", "torch", "--count", "abc", "--", "true"], ["capture", "torch", "--config", "missing.toml",
                                                                   "--", "true"],
            ["capture", "torch", "--config", "bad.toml", "--", "true"], ["capture", "torch", "--torchrun", "0",
                                                                          "--", "true"],
            ["capture", "nsys", "--", "python3", "missing.py"], ["capture", "ncu", "--", "python3", "missing.py"],
            ["capture", "torch", "--out", "/dev/full", "--", "python3", "-c", "pass"],
            ["capture", "torch", "--name", "../../etc", "--dry-run", "--", "python3", "-c", "pass"],
            ["bench", "llama", "--bogus"], ["eval", "ppl", "--bogus"]]
    for flags in (["--port", "70000"], ["--port", "-1"], ["--preset", "nope"], ["--layers", "0"], ["--layers", "-1"],
                  ["--device", "tpu"], ["--block-size", "0"], ["--num-blocks", "0"], ["--max-num-seqs", "0"],
                  ["--dtype", "nope"], ["--tensor-parallel", "0"], ["--vocab", "-5"], ["--fail-rate", "2"],
                  ["--max-request-mb", "0"], ["--event-log", "/dev/full"], ["--event-log", "-"],
                  ["--host", "256.0.0.1"], ["--max-model-len", "0"], ["--gpu-memory-fraction", "0"]):
        bad.append(["serve", "--port", "0", *flags])
    out = []
    prep = [("mkdir", "adir"), ("write", "bad.toml", "[[[ not toml"), ("write", "empty.toml", ""),
            ("write", "wrong.toml", "rules = 5\npeaks = 'x'\n[category]\nname = 7\n"), ("write", "empty.md", "")]
    for argv in helps:
        out.append(Case("subcommands", "subcommands/help/" + ("_".join(argv) or "none"), argv, timeout_s=60))
    for i, argv in enumerate(bad):
        label = "_".join(a if len(a) < 20 and "/" not in a else Path(a).name[:20] for a in argv)
        out.append(Case("subcommands", f"subcommands/{i:03d}_{label}"[:150], argv, inputs=[k, peer, rep],
                        prepare=prep, allow_1=argv[0] == "compare" and "--gate" in " ".join(argv),
                        outputs=["r.md"] if argv[0] == "report" else [], timeout_s=45))
    return out
