"""The judge's decision, in this process: math-verify reads and compares, numbers are compared exactly."""

from __future__ import annotations

import pytest

from areal.rewards.math.verdict import answers_match, read_answer

pytest.importorskip("math_verify")


@pytest.mark.parametrize(
    ("reference", "answer"),
    [
        (r"\frac{1}{2^{20}}", r"\frac{1}{2^{21}}"),  # defect 1 of the old checker: any tiny value equalled any other
        (r"\frac{1}{2^{10}}", r"\frac{1}{1023}"),
        (r"\frac{1}{2^{30}}", "0"),
        (r"\frac{1}{2^{99}}", r"\frac{1}{2^{98}}"),  # math-verify's own: its numeric test chops below 1e-15
        (r"\frac{1}{2004!}", r"\frac{1}{2006!}"),
        (r"\frac{1}{10^{9}}", "0.000000002"),  # and it rounds decimals to 6 places
        (r"\begin{pmatrix} 0 \\ 0 \end{pmatrix}", r"\begin{pmatrix} 10^{-9} \\ 0 \end{pmatrix}"),
        ("(0, 0)", "(0, 10^{-8})"),
        ("x^2", "x^2 + 10^{-20}"),
    ],
)
def test_tiny_values_are_not_equal_to_other_tiny_values(reference, answer):
    assert not answers_match(reference, answer)


def test_defect_2_a_thousands_separator_with_thin_spaces_reads_as_one_number():
    assert read_answer(r"11,\! 111,\! 111,\! 100") == "11111111100"
    assert answers_match("11111111100", r"11,\! 111,\! 111,\! 100")
    assert answers_match(r"11,\! 111,\! 111,\! 100", "11111111100")
    assert answers_match("32349", r"32,\! 349") and answers_match("10000", "10{,}000")
    assert not answers_match("100000", "10,000") and not answers_match("23", "2, 3")


@pytest.mark.parametrize(
    ("reference", "close"),
    [("1000000", "999999"), ("10!", "3628801"), ("2^{64}", "18446744073709551615"), ("3", "2.9999999")],
)
def test_exact_integers_are_compared_exactly(reference, close):
    assert not answers_match(reference, close)


def test_exact_integers_equal_their_closed_forms():
    assert answers_match("10!", "3628800") and answers_match("2^{64}", "18446744073709551616")


@pytest.mark.parametrize(
    ("reference", "rounded"),
    [(r"\pi", "3.14159"), (r"\pi", "3.141593"), (r"\frac{1}{3}", "0.333333"), (r"\sqrt{2}", "1.41421356"),
     (r"\begin{pmatrix} \sqrt{2} \\ 1 \end{pmatrix}", r"\begin{pmatrix} 1.4142136 \\ 1 \end{pmatrix}")],
)
def test_a_rounded_decimal_is_not_an_exact_value(reference, rounded):
    assert not answers_match(reference, rounded)


def test_a_decimal_is_the_exact_value_it_writes():
    assert answers_match(r"\frac{3}{8}", "0.375") and answers_match("0.375", r"\frac38")
    assert answers_match(r"\frac{1}{3}", r"0.\overline{3}") and answers_match("1", r"0.\overline{9}")


def test_a_percent_sign_is_not_a_factor_of_100():
    assert not answers_match(r"25\%", r"0.25\%") and not answers_match("0.25", r"0.25\%")
    assert answers_match(r"25\%", "0.25") and answers_match(r"25\%", "25") and answers_match("25", r"25\%")
    assert answers_match(r"33\frac{1}{3}\%", r"\frac{1}{3}") and answers_match(r"12.5\%", "12.5")


def test_a_mixed_number_is_not_a_product():
    assert not answers_match("1", r"2\frac{1}{2}") and not answers_match("5", r"10\frac{1}{2}")
    assert answers_match(r"\frac{5}{2}", r"2\frac{1}{2}") and answers_match("1.5", "1 1/2")
    assert read_answer(r"2 \cdot 3\frac{1}{2}") == r"2 \cdot 3\frac{1}{2}"  # not a mixed number: left as written


def test_a_value_named_for_another_variable_is_another_answer():
    assert not answers_match("y = 2", "x = 2") and not answers_match("k = 3", "n = 3")
    assert answers_match("x = 2", "2") and answers_match("2", "x = 2") and answers_match("k = 4", "k = 4.0")


def test_structures_math_verify_reads():
    assert answers_match("(-\\infty, 3)", "x < 3") and answers_match("[-2, 2]", r"-2 \le x \le 2")
    assert not answers_match("[-2, 2]", "-2 < x < 2") and not answers_match("[1, 2)", "(1, 2)")
    assert answers_match("(3, 2)", "(p, q) = (3, 2)") and not answers_match("(3, 2)", "(p, q) = (2, 3)")
    assert answers_match(r"\{1, 2, 3\}", "3, 2, 1") and answers_match("x + y = 5", "2x + 2y = 10")
    assert not answers_match("3x - y + 13 = 0", "3x + 4y + 14 = 0")
    matrix = r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}"
    transposed = r"\begin{pmatrix} 1 & 3 \\ 2 & 4 \end{pmatrix}"
    assert not answers_match(matrix, transposed) and answers_match(matrix, matrix.replace("pmatrix", "bmatrix"))


def test_a_division_by_zero_equals_nothing_but_the_same_text():
    assert not answers_match("12:00", "1:00")
    assert answers_match("12:00", "12:00")


def test_spellings_read_as_numbers():
    assert answers_match("1000", "1e3") and answers_match(r"\sqrt{2}", "√2") and answers_match("3", r"\text{three}")
    assert answers_match("1000000", r"1\,000\,000") and answers_match("1000000", "1 000 000")


def test_a_reference_printed_from_a_float_is_equal_to_its_last_place_and_a_rounded_one_exactly():
    assert answers_match("0.6666666666666666", r"\frac{2}{3}") and answers_match("2.23606797749979", r"\sqrt{5}")
    assert not answers_match("0.6666666666666666", "0.6666667")  # a rounded answer is still compared exactly
    assert not answers_match("0.33", r"\frac{1}{3}") and not answers_match("0.000001", "0")


def test_a_number_and_its_unit_in_words_is_the_number():
    assert answers_match(r"\$10", "10 dollars") and answers_match("12", "12 apples each")
    assert read_answer("2 or 3") == "2 or 3"  # alternatives are not a unit
