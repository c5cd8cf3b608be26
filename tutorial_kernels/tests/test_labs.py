"""The labs' grader can fail: every step's solution passes, its unfilled skeleton fails, and planted
typical mistakes are caught with their own hint (on the CPU, through Triton's interpreter)."""

from __future__ import annotations

import inspect

import pytest
import triton
import triton.language as tl

from tutorial_kernels import ch05_flash_v2
from tutorial_kernels.labs import ch05, check
from tutorial_kernels.labs.grader import LAB_MODULES, LABS
from tutorial_kernels.tests.planted import assert_caught_with_its_hint

STEPS = [step for steps in LABS.values() for step in steps.values()]


@pytest.mark.parametrize("step", STEPS, ids=lambda s: s.name)
def test_the_solution_passes(step, capsys):
    report = check(step.name, step.solution)
    assert report.passed, report.message
    assert report.cases_passed == report.cases
    assert "✓" in capsys.readouterr().out


@pytest.mark.parametrize("step", STEPS, ids=lambda s: s.name)
def test_the_unfilled_skeleton_fails_with_a_report(step):
    report = check(step.name, step.skeleton, quiet=True)
    assert not report.passed
    assert "case: " in report.message and "hint:" in report.message


# --- planted mistakes: each is the solution with one typical slip -------------------------------------

@triton.jit
def _mask_finite(s, offs_m, cols, n_q, n_k, CAUSAL: tl.constexpr):
    visible = cols[None, :] < n_k
    if CAUSAL:
        visible = visible & (cols[None, :] <= offs_m[:, None] + (n_k - n_q))
    return tl.where(visible, s, -1e9)


@triton.jit
def _mask_top_left(s, offs_m, cols, n_q, n_k, CAUSAL: tl.constexpr):
    visible = cols[None, :] < n_k
    if CAUSAL:
        visible = visible & (cols[None, :] <= offs_m[:, None])
    return tl.where(visible, s, float("-inf"))


@triton.jit
def _mask_strict(s, offs_m, cols, n_q, n_k, CAUSAL: tl.constexpr):
    visible = cols[None, :] < n_k
    if CAUSAL:
        visible = visible & (cols[None, :] < offs_m[:, None] + (n_k - n_q))
    return tl.where(visible, s, float("-inf"))


@triton.jit
def _update_no_alpha(acc, l_i, m_i, s, v, DOT_PRECISION: tl.constexpr):
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s - shift[:, None])
    alpha = tl.math.exp2(m_i - shift)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)  # acc not rescaled
    return acc, l_i, m_new


@triton.jit
def _update_exp(acc, l_i, m_i, s, v, DOT_PRECISION: tl.constexpr):
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(s - shift[:, None])
    alpha = tl.exp(m_i - shift)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, l_i, m_new


@triton.jit
def _update_no_guard(acc, l_i, m_i, s, v, DOT_PRECISION: tl.constexpr):
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, l_i, m_new


@triton.jit
def _stages_off_by_one(start_m, n_q, n_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    unmasked_end = tl.maximum(tl.minimum(start_m + (n_k - n_q), n_k) // BLOCK_N * BLOCK_N, 0)
    masked_end = tl.maximum(tl.minimum(start_m + BLOCK_M + (n_k - n_q), n_k), 0)
    return unmasked_end, masked_end


@triton.jit
def _stages_top_left(start_m, n_q, n_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    unmasked_end = tl.maximum(tl.minimum(start_m + 1, n_k) // BLOCK_N * BLOCK_N, 0)
    masked_end = tl.maximum(tl.minimum(start_m + BLOCK_M, n_k), 0)
    return unmasked_end, masked_end


@triton.jit
def _stages_not_whole_tiles(start_m, n_q, n_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    unmasked_end = tl.maximum(tl.minimum(start_m + (n_k - n_q) + 1, n_k), 0)
    masked_end = tl.maximum(tl.minimum(start_m + BLOCK_M + (n_k - n_q), n_k), 0)
    return unmasked_end, masked_end


PLANTED = [
    ("ch05.mask", _mask_finite, "finite"),
    ("ch05.mask", _mask_top_left, "alignment"),
    ("ch05.mask", _mask_strict, "off_by_one"),
    ("ch05.online_softmax", _update_no_alpha, "no_rescale_acc"),
    ("ch05.online_softmax", _update_exp, "exp"),
    ("ch05.online_softmax", _update_no_guard, "nan"),
    ("ch05.causal_stages", _stages_off_by_one, "off_by_one"),
    ("ch05.causal_stages", _stages_top_left, "alignment"),
    ("ch05.causal_stages", _stages_not_whole_tiles, "round_down"),
]


@pytest.mark.parametrize("step, fn, mistake", PLANTED, ids=[f"{s}-{m}" for s, _, m in PLANTED])
def test_a_planted_mistake_is_caught_with_its_hint(step, fn, mistake):
    assert_caught_with_its_hint(step, fn, mistake)


def test_an_unknown_step_is_named_with_the_known_ones():
    with pytest.raises(ValueError, match="ch05.mask"):
        check("ch05.nope", ch05.mask_scores)


def test_the_solutions_are_the_chapters_lines():
    """The mask and update solutions are `_flash_v2_minimal_kernel`'s own lines (comments aside)."""
    chapter = {line.split("#")[0].strip() for line in inspect.getsource(ch05_flash_v2._flash_v2_minimal_kernel.fn)
               .splitlines()}
    for solution in (ch05.mask_scores, ch05.online_softmax_update):
        body = inspect.getsource(solution.fn).split('"""')[2].splitlines()
        for line in body:
            code = line.split("#")[0].strip()
            if code and not code.startswith("return"):
                assert code in chapter, f"{solution.__name__}: {code!r} is not in the chapter's kernel"


@pytest.mark.parametrize("lab", LAB_MODULES)
def test_the_lab_notebook_starts_from_the_modules_skeletons(lab):
    """The notebook's cells to fill in are the skeletons graded here (renamed without `_skeleton`)."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "notebooks" / "labs" / LAB_MODULES[lab].NOTEBOOK
    cells = ["".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
             if c["cell_type"] == "code"]
    for step in LABS[lab].values():
        skeleton = inspect.getsource(getattr(step.skeleton, "fn", step.skeleton)).replace("_skeleton(", "(", 1).strip()
        assert skeleton in [c.strip() for c in cells], f"{path.name} has no cell with the skeleton of {step.name}"


@pytest.mark.parametrize("lab", LAB_MODULES)
def test_every_lab_is_on_the_site_under_its_chapter(lab):
    """Each lab's notebook is in the nav right after its chapter's notebook, in the chapter's section, and its
    chapter page links it."""
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[2]
    notebook = f"notebooks/labs/{LAB_MODULES[lab].NOTEBOOK}"
    assert (root / notebook).is_file(), f"{lab}: {notebook} is missing"
    # from `nav:` on: the rest of mkdocs.yml holds tags (!!python/name) that safe_load refuses
    nav = yaml.safe_load("nav:" + (root / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:", 1)[1])
    chapters = next(entry["Chapters"] for entry in nav["nav"] if isinstance(entry, dict) and "Chapters" in entry)
    # a section per chapter (its text, notebook and lab), in order
    pages = [next(iter(page.values())) for section in chapters for page in next(iter(section.values()))]
    number = lab.removeprefix("ch")
    assert notebook in pages, f"{notebook} is not in mkdocs.yml's nav"
    chapter_notebook = next(p for p in pages if p.startswith(f"notebooks/{number}_"))
    assert pages.index(notebook) == pages.index(chapter_notebook) + 1, f"{notebook} should follow {chapter_notebook}"
    page = next((root / "docs" / "chapters").glob(f"{number}-*.md"))
    assert f"../{notebook}" in page.read_text(encoding="utf-8"), f"{page.name} does not link its lab"


# --- lab 8: each planted mistake is the solution's own source with one slip edited in -------------------

def _slip(directory, solution, *edits):
    """`solution` (a @triton.jit helper) with each (old, new) of `edits` replaced in its source (each `old`
    exactly once), jitted from a file in `directory`: Triton reads a function's source from its file."""
    import importlib.util
    import sys

    source = inspect.getsource(solution.fn)
    for old, new in edits:
        assert source.count(old) == 1, f"{old!r} is not once in {solution.fn.__name__}"
        source = source.replace(old, new)
    name = f"planted_{directory.name}"
    path = directory / f"{name}.py"
    path.write_text("import triton\nimport triton.language as tl\n\nfrom tutorial_kernels.tiling import to_log2_units\n\n\n"
                    + source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, solution.fn.__name__)


_ONE_ENTRY_NEVER = ("if PAGE % BLOCK_N == 0:", "if PAGE < 0:")  # a learner's version: each key's own table entry
PLANTED_CH08 = [
    ("ch08.split_pass", "no_clip", [("end = tl.minimum(start + keys_per_split, n_k)", "end = start + keys_per_split")]),
    ("ch08.split_pass", "ragged", [("visible = key_ok[None, :] & row_ok[:, None]",
                                    "visible = row_ok[:, None] & (offs_n[None, :] >= 0)")]),
    ("ch08.split_pass", "whole_tiles", [("tl.cdiv(tl.cdiv(n_k, n_splits), BLOCK_N) * BLOCK_N",
                                         "tl.cdiv(n_k, n_splits)")]),
    ("ch08.split_pass", "no_rescale_acc", [("acc = acc * alpha[:, None] + tl.dot(", "acc = acc + tl.dot(")]),
    ("ch08.split_pass", "no_rescale_l", [("l_i = l_i * alpha + tl.sum(p, 1)", "l_i = l_i + tl.sum(p, 1)")]),
    ("ch08.split_pass", "exp", [("tl.math.exp2(s - shift[:, None])", "tl.exp(s - shift[:, None])"),
                                ("tl.math.exp2(m_i - shift)", "tl.exp(m_i - shift)")]),
    ("ch08.split_pass", "not_normalised", [("o = acc / tl.where(seen, l_i, 1.0)[:, None]", "o = acc")]),
    ("ch08.split_pass", "lse_ln", [("m_i + tl.math.log2(", "m_i + tl.log(")]),
    ("ch08.split_pass", "lse_no_max", [("seen, m_i + tl.math.log2(", "seen, tl.math.log2(")]),
    ("ch08.split_pass", "lse_zero", [('l_i, 1.0)), float("-inf"))', "l_i, 1.0)), 0.0)")]),
    ("ch08.split_pass", "nan", [("o = acc / tl.where(seen, l_i, 1.0)[:, None]", "o = acc / l_i[:, None]")]),
    ("ch08.combine", "exp", [("w = tl.math.exp2(lse_s - shift)", "w = tl.exp(lse_s - shift)")]),
    ("ch08.combine", "log", [("shift + tl.math.log2(", "shift + tl.log(")]),
    ("ch08.combine", "no_top", [("shift + tl.math.log2(", "tl.math.log2(")]),
    ("ch08.combine", "not_normalised", [("(w / tl.where(total > 0, total, 1.0))[:, None]", "w[:, None]")]),
    ("ch08.combine", "unweighted", [("o = tl.sum(o_s * (w / tl.where(total > 0, total, 1.0))[:, None], 0)",
                                     "o = tl.sum(o_s, 0)")]),
    ("ch08.combine", "no_guard", [('shift = tl.where(top == float("-inf"), 0.0, top)', "shift = top")]),
    ("ch08.combine", "no_max", [("w = tl.math.exp2(lse_s - shift)", "w = tl.math.exp2(lse_s)"),
                                ("shift + tl.math.log2(", "tl.math.log2(")]),
    ("ch08.paged_rows", "swap", [_ONE_ENTRY_NEVER, ("(offs_n // PAGE) * stride_tn", "(offs_n % PAGE) * stride_tn"),
                                 ("(rows_n % PAGE) * stride_kn", "(rows_n // PAGE) * stride_kn"),
                                 ("(rows_n % PAGE) * stride_vn", "(rows_n // PAGE) * stride_vn")]),
    ("ch08.paged_rows", "no_table", [_ONE_ENTRY_NEVER, ("tl.load(table_ptr + batch * stride_tb + (offs_n // PAGE) * "
                                                        "stride_tn, mask=key_ok, other=0)", "offs_n // PAGE")]),
    ("ch08.paged_rows", "batch_row", [_ONE_ENTRY_NEVER, ("table_ptr + batch * stride_tb + (offs_n",
                                                         "table_ptr + (offs_n")]),
    ("ch08.paged_rows", "no_row", [("block * stride_kb + (rows_n % PAGE) * stride_kn", "block * stride_kb"),
                                   ("block * stride_vb + (rows_n % PAGE) * stride_vn", "block * stride_vb")]),
    ("ch08.paged_rows", "v_strides", [("block * stride_vb + (rows_n % PAGE) * stride_vn",
                                       "block * stride_kb + (rows_n % PAGE) * stride_kn")]),
    ("ch08.paged_rows", "one_entry", [("if PAGE % BLOCK_N == 0:", "if PAGE > 0:")]),
    ("ch08.paged_rows", "unmasked", [(", mask=key_ok, other=0)", ")")]),
]


@pytest.mark.parametrize("step, mistake, edits", PLANTED_CH08, ids=[f"{s}-{m}" for s, m, _ in PLANTED_CH08])
def test_a_planted_lab8_mistake_is_caught_with_its_hint(step, mistake, edits, tmp_path):
    from tutorial_kernels.labs.grader import find_step

    assert_caught_with_its_hint(step, _slip(tmp_path, find_step(step).solution, *edits), mistake)


def test_every_lab8_mistake_is_planted():
    """Each typical mistake of lab 8 but the untouched skeleton has a planted slip above that triggers it."""
    planted = {(step, mistake) for step, mistake, _ in PLANTED_CH08}
    for step in LABS["ch08"].values():
        for mistake in step.mistakes:
            assert mistake.name == "unchanged" or (step.name, mistake.name) in planted, (step.name, mistake.name)


def test_the_lab8_solutions_are_the_chapters_lines():
    """The split pass and the paged rows are `_decode_partial_kernel`'s lines, the merge `_decode_combine_kernel`'s
    (comments aside); the lab's call of KV_TILE stands where the chapter computes the rows and loads K and V."""
    from tutorial_kernels import ch08_decode
    from tutorial_kernels.labs import ch08

    for solution, kernel in ((ch08.split_pass, ch08_decode._decode_partial_kernel),
                             (ch08.combine_splits, ch08_decode._decode_combine_kernel),
                             (ch08.paged_rows, ch08_decode._decode_partial_kernel)):
        chapter = {line.split("#")[0].strip() for line in inspect.getsource(kernel.fn).splitlines()}
        for line in inspect.getsource(solution.fn).split('"""')[2].splitlines():
            code = line.split("#")[0].strip()
            if code and not code.startswith(("return", "k, v = KV_TILE(")):
                assert code in chapter, f"{solution.__name__}: {code!r} is not in {kernel.__name__}"


# --- lab 5's whole kernel: each planted mistake is the chapter's kernel with one slip edited in ------------

PLANTED_CH05_KERNEL = [
    ("ragged", [("visible = cols[None, :] < n_k  # the ragged last tile", "visible = cols[None, :] >= 0")]),
    ("finite", [('s = tl.where(visible, s, float("-inf"))', "s = tl.where(visible, s, -1e9)")]),
    ("alignment", [("visible & (cols[None, :] <= offs_m[:, None] + (n_k - n_q))",
                    "visible & (cols[None, :] <= offs_m[:, None])")]),
    ("off_by_one", [("visible & (cols[None, :] <= offs_m[:, None] + (n_k - n_q))",
                     "visible & (cols[None, :] < offs_m[:, None] + (n_k - n_q))")]),
    ("loop_end", [("tl.minimum((pid_m + 1) * BLOCK_M + (n_k - n_q), n_k)", "tl.minimum((pid_m + 1) * BLOCK_M, n_k)")]),
    ("no_rescale_acc", [("acc = acc * alpha[:, None]  #", "acc = acc  #")]),
    ("no_rescale_l", [("l_i = l_i * alpha + tl.sum(p, axis=1)", "l_i = l_i + tl.sum(p, axis=1)")]),
    ("exp", [("p = tl.math.exp2(s - shift[:, None])", "p = tl.exp(s - shift[:, None])"),
             ("alpha = tl.math.exp2(m_i - shift)", "alpha = tl.exp(m_i - shift)")]),
    ("nan", [("p = tl.math.exp2(s - shift[:, None])", "p = tl.math.exp2(s - m_new[:, None])"),
             ("alpha = tl.math.exp2(m_i - shift)", "alpha = tl.math.exp2(m_i - m_new)")]),
    ("not_normalised", [("o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]", "o = acc")]),
    ("nan", [("o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]", "o = acc / l_i[:, None]")]),  # 0 / 0
    ("nan_rows", [("tl.store(o_ptr + batch * stride_ob + head * stride_oh", "tl.store(o_ptr + batch * stride_ob")]),
    ("no_scale", [("s = tl.dot(q, k_t, input_precision=DOT_PRECISION) * qk_scale",
                   "s = tl.dot(q, k_t, input_precision=DOT_PRECISION)")]),
    ("causal_ignored", [("tl.minimum((pid_m + 1) * BLOCK_M + (n_k - n_q), n_k) if CAUSAL else n_k", "n_k"),
                        ("visible & (cols[None, :] <= offs_m[:, None] + (n_k - n_q))", "visible")]),
    ("m_not_updated", [("        m_i = m_new\n", "        m_i = m_i\n")]),
]


@pytest.mark.parametrize("mistake, edits", PLANTED_CH05_KERNEL,
                         ids=[f"{m}-{i}" for i, (m, _) in enumerate(PLANTED_CH05_KERNEL)])
def test_a_planted_mistake_in_lab5s_whole_kernel_is_caught_with_its_hint(mistake, edits, tmp_path):
    assert_caught_with_its_hint("ch05.kernel", _slip(tmp_path, ch05.flash_forward_kernel, *edits), mistake)


def test_every_mistake_of_lab5s_whole_kernel_is_planted():
    planted = {mistake for mistake, _ in PLANTED_CH05_KERNEL} | {"unwritten"}  # unwritten: the skeleton itself
    assert planted == {m.name for m in ch05.KERNEL_MISTAKES}


def test_a_store_without_its_mask_is_reported_not_a_crash(tmp_path):
    """Rows past n_q and columns past head_dim stored: the lab's slack after O takes them, and the report names it
    (without the slack, Triton's interpreter writes over memory the process does not own and dies)."""
    slip = _slip(tmp_path, ch05.flash_forward_kernel, ("o.to(o_ptr.dtype.element_ty), mask=(offs_m[:, None] < n_q) & "
                                                       "d_ok[None, :])", "o.to(o_ptr.dtype.element_ty))"))
    report = check("ch05.kernel", slip, quiet=True)
    assert not report.passed and "wrote past the end of O" in report.message, report.message


def test_a_kernel_that_reads_v_with_ks_strides_fails_the_grouped_query_cases(tmp_path):
    slip = _slip(tmp_path, ch05.flash_forward_kernel, ("cols[:, None] * stride_vn + offs_d[None, :] * stride_vd",
                                                       "cols[:, None] * stride_kn + offs_d[None, :] * stride_kd"))
    report = check("ch05.kernel", slip, quiet=True)
    assert not report.passed and "4 query heads on 2 key/value heads" in report.message, report.message


def test_a_kernel_that_ignores_the_key_value_head_fails_the_grouped_query_cases(tmp_path):
    """Right on every case with as many key/value heads as query heads, wrong with grouped-query heads."""
    slip = _slip(tmp_path, ch05.flash_forward_kernel, ("kv_head = head // group_size", "kv_head = head"))
    report = check("ch05.kernel", slip, quiet=True)
    assert not report.passed and "4 query heads on 2 key/value heads" in report.message, report.message
    assert "head // group_size" in report.message


# --- lab 6's whole dK/dV kernel: each planted mistake is the solution with one slip edited in -------------

PLANTED_CH06_DKDV = [
    ("no_mask", [("p_t = tl.where(visible, p_t, 0.0)", "p_t = p_t")]),
    ("alignment", [("offs_n[:, None] <= offs_m[None, :] + (n_k - n_q)", "offs_n[:, None] <= offs_m[None, :]")]),
    ("off_by_one", [("offs_n[:, None] <= offs_m[None, :] + (n_k - n_q)", "offs_n[:, None] < offs_m[None, :] + (n_k - n_q)")]),
    ("no_delta", [("ds_t = p_t * (dp_t - delta[None, :])", "ds_t = p_t * dp_t")]),
    ("no_scale", [("dk = dk * sm_scale  #", "dk = dk  #")]),
    ("group", [("for h in range(group_size):", "for h in range(1):")]),
]


@pytest.mark.parametrize("mistake, edits", PLANTED_CH06_DKDV, ids=[m for m, _ in PLANTED_CH06_DKDV])
def test_a_planted_mistake_in_lab6s_dkdv_kernel_is_caught_with_its_hint(mistake, edits, tmp_path):
    from tutorial_kernels.labs import ch06

    assert_caught_with_its_hint("ch06.dkdv", _slip(tmp_path, ch06.dkdv_kernel, *edits), mistake)


def test_every_mistake_of_lab6s_dkdv_kernel_is_planted():
    from tutorial_kernels.labs import ch06

    planted = {mistake for mistake, _ in PLANTED_CH06_DKDV} | {"unwritten"}  # unwritten: the skeleton itself
    assert planted == {m.name for m in ch06.DKDV_MISTAKES}


def test_lab6s_dkdv_solution_is_the_chapters_lines():
    """The whole-kernel solution is chapter 6's dK/dV kernel and its inner loop, line for line (comments aside),
    but for the one-stage loop that replaces the chapter's two."""
    from tutorial_kernels import ch06_backward
    from tutorial_kernels.labs import ch06

    chapter = {line.split("#")[0].strip() for fn in (ch06_backward._attn_bwd_dkdv_kernel, ch06_backward._dkdv_from_query_tiles)
               for line in inspect.getsource(fn.fn).splitlines()}
    own = {"for start_m in range(0, n_q, BLOCK_M):", "if CAUSAL:", "d_ok = offs_d < head_dim"}  # the one stage
    body = inspect.getsource(ch06.dkdv_kernel.fn).split('"""')[2].splitlines()
    for line in body:
        code = line.split("#")[0].strip()
        if code and code not in own:
            assert code in chapter, f"{code!r} is not in chapter 6's dK/dV kernel"


# --- lab 3's whole online-softmax kernel ---------------------------------------------------------------

PLANTED_CH03_KERNEL = [
    ("no_rescale", [("l = l * tl.exp(m - shift) + ", "l = l + ")]),
    ("m0_zero", [('m = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), axis=0)',
                  "m = tl.max(tl.zeros([BLOCK], tl.float32), axis=0)")]),
    ("ragged", [('mask=start + cols < n_cols, other=float("-inf"))', "mask=start + cols < n_cols, other=0.0)")]),
    ("nan", [('shift = tl.where(m_new == float("-inf"), 0.0, m_new)', "shift = m_new")]),
    ("not_normalised", [("(tl.exp(x - shift) * inv_l)", "(tl.exp(x - shift))")]),
    ("zeros", [("tl.exp(m - shift)", "tl.exp(shift - m)")]),  # upside down: every ℓ NaN, every row guarded to 0
]


@pytest.mark.parametrize("mistake, edits", PLANTED_CH03_KERNEL, ids=[m for m, _ in PLANTED_CH03_KERNEL])
def test_a_planted_mistake_in_lab3s_whole_kernel_is_caught_with_its_hint(mistake, edits, tmp_path):
    from tutorial_kernels.labs import ch03

    assert_caught_with_its_hint("ch03.softmax_kernel", _slip(tmp_path, ch03.online_softmax_kernel, *edits), mistake)


def test_every_mistake_of_lab3s_whole_kernel_is_planted():
    from tutorial_kernels.labs import ch03

    planted = {mistake for mistake, _ in PLANTED_CH03_KERNEL} | {"unwritten"}  # unwritten: the skeleton itself
    assert planted == {m.name for m in ch03.SOFTMAX_KERNEL_MISTAKES}


# --- lab 6's capstone: the autograd.Function ------------------------------------------------------------

def _planted_function(forward_causal=None, backward_scale=True, keep_p=False, grads=True, arity=6):
    """Chapter 6's Function with one slip: the forward's mask forced, the backward's scale dropped, P kept,
    no gradients returned, or too few values returned."""
    import torch

    from tutorial_kernels.ch05_flash_v2 import flash_attn_v2_with_lse
    from tutorial_kernels.ch06_backward import flash_attn_backward

    class Planted(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal, sm_scale, tuned):
            o, lse = flash_attn_v2_with_lse(q, k, v, causal if forward_causal is None else forward_causal, sm_scale)
            extra = [torch.softmax(q @ k.transpose(-2, -1).repeat_interleave(q.shape[1] // k.shape[1], 1), -1)] if keep_p else []
            ctx.save_for_backward(q, k, v, o, lse, *extra)
            ctx.causal, ctx.sm_scale = causal, sm_scale
            return o

        @staticmethod
        def backward(ctx, do):
            q, k, v, o, lse = ctx.saved_tensors[:5]
            dq, dk, dv = flash_attn_backward(q, k, v, o, lse, do.contiguous(), ctx.causal,
                                             ctx.sm_scale if backward_scale else None)
            out = (dq, dk, dv) if grads else (None, None, None)
            return (*out, None, None, None)[:arity]

    return Planted


@pytest.mark.parametrize("mistake, slip", [("causal", dict(forward_causal=False)), ("scale", dict(backward_scale=False)),
                                           ("saves_p", dict(keep_p=True)), ("no_grads", dict(grads=False))])
def test_a_planted_mistake_in_lab6s_autograd_function_is_caught_with_its_hint(mistake, slip):
    assert_caught_with_its_hint("ch06.autograd", _planted_function(**slip), mistake)


def test_lab6s_autograd_grader_names_a_wrong_number_of_gradients():
    report = check("ch06.autograd", _planted_function(arity=3), quiet=True)
    assert not report.passed and "one value per forward argument" in report.message, report.message


def test_every_mistake_of_lab6s_autograd_step_is_planted():
    from tutorial_kernels.labs import capstone

    assert {m.name for m in capstone.AUTOGRAD_MISTAKES} == {"unchanged", "causal", "scale", "saves_p", "no_grads"}
