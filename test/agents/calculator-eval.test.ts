import { describe, expect, it } from "vitest";
import { evaluateExpression as ev, formatNumber } from "../../src/agents/calculator-eval.ts";

describe("calculator arithmetic", () => {
  it.each([
    ["16-3-4", "9"],
    ["9*2", "18"],
    ["2/2", "1"],
    ["80000*1.5", "120000"],
    [".05*104000", "5200"],
    ["0.1+0.2", "0.3"],
    ["2/3", "0.6666666667"],
    ["10/4", "2.5"],
    ["-2^2", "-4"], // ^ binds tighter than unary minus, as in mathematics
    ["2^3^2", "512"], // right-associative
    ["2^-1", "0.5"],
    ["(1+2)*(3+4)", "21"],
    ["2(3+1)", "8"], // implicit multiplication
    ["5--3", "8"],
    ["50%*20", "10"], // postfix % is percent
    ["20*15%", "3"],
    ["10%3", "1"], // infix % is modulo
    ["-7 mod 3", "2"], // floored, sign of the divisor
    ["3!", "6"],
    ["sqrt(144)", "12"],
    ["cbrt(27)", "3"],
    ["nthRoot(-8, 3)", "-2"],
    ["abs(-3.5)", "3.5"],
    ["round(2.5)", "3"],
    ["round(-2.5)", "-3"],
    ["round(1.005, 2)", "1.01"],
    ["floor(7/2) + ceil(7/2)", "7"],
    ["fix(-3.7)", "-3"],
    ["min(4, 2, 8) + max(1, 9)", "11"],
    ["log(8, 2)", "3"],
    ["log10(1000)", "3"],
    ["exp(0)", "1"],
    ["gcd(12, 18) * lcm(4, 6)", "72"],
    ["pi", "3.141592654"],
    ["1e3 + 0x10", "1016"],
    ["3 × 4 ÷ 2 − 1", "5"], // typographic operators
    ["  12 * ( 3 + 4 )  ", "84"],
    ["123456789 * 1000", "123456789000"],
    ["1/3*3", "1"],
    ["1e21*10", "1e+22"],
    ["0.000000123456789123", "1.234567891e-7"],
    ["-0", "0"],
    ["(((((((((((1)))))))))))", "1"],
  ])("%s = %s", (expr, want) => {
    expect(ev(expr)).toBe(want);
  });

  it("formats like a calculator", () => {
    expect(formatNumber(3)).toBe("3");
    expect(formatNumber(-0)).toBe("0");
    expect(formatNumber(0.1 + 0.2)).toBe("0.3");
    expect(formatNumber(1234.5678901234)).toBe("1234.56789");
    expect(formatNumber(2 ** 53 - 1)).toBe("9007199254740991"); // exact up to the safe-integer limit
    expect(formatNumber(2 ** 60)).toBe("1152921505000000000"); // beyond it, 10 significant digits
    expect(() => formatNumber(Infinity)).toThrow(/not a finite number/);
  });
});

describe("calculator refuses what is not arithmetic", () => {
  // Each one comes back as one "Error: ..." line; the pattern checks the message says why.
  it.each([
    ["import({sqrt: 1}, {override: true})", /unknown function "import"/],
    ['createUnit("foo")', /unknown function "createUnit"/],
    ['evaluate("1+1")', /unknown function "evaluate"/],
    ['parse("1")', /unknown function "parse"/],
    ['compile("1")', /unknown function "compile"/],
    ['simplify("x+x")', /unknown function "simplify"/],
    ['derivative("x^2", "x")', /unknown function "derivative"/],
    ["resolve(1)", /unknown function "resolve"/],
    ["config({number: 'BigNumber'})", /unknown function "config"/],
    ['[].constructor.constructor("return process")()', /^Error: /],
    ['cos.constructor("return process")()', /^Error: /],
    ["a.b(1)", /unknown function "a.b"/],
    ["constructor(1)", /unknown function "constructor"/],
    ["__proto__(1)", /unknown function "__proto__"/],
    ["hasOwnProperty(1)", /unknown function "hasOwnProperty"/],
    ["toString + 1", /unknown symbol "toString"/],
    ["f(x) = x^2", /assignment is not supported/],
    ["a = 1", /assignment is not supported/],
    ["x + 1", /unknown symbol "x"/],
    ['"abc"', /only numbers are accepted, not string/],
    ["true + 1", /only numbers are accepted, not boolean/],
    ["[1, 2, 3]", /matrices are not supported/],
    ["ones(1e8)", /unknown function "ones"/],
    ["zeros(1e4, 1e4)", /unknown function "zeros"/],
    ["range(1, 1e9)", /unknown function "range"/],
    ["1:1e9", /ranges are not supported/],
    ["{a: 1}", /objects are not supported/],
    ["1 ? 2 : 3", /conditionals are not supported/],
    ["1; 2", /several statements are not supported/],
    ["5 > 3", /operator ">" is not supported/],
    ["5 cm + 3 inch", /unknown symbol "cm"/],
    ["9^9^9", /too large/],
    ["factorial(1e6)", /factorial needs an integer from 0 to 170/],
    ["171!", /factorial needs an integer/],
    ["2.5!", /factorial needs an integer/],
    ["1e400", /too large/],
    ["1/0", /division by zero/],
    ["5 % 0", /modulo by zero/],
    ["sqrt(-1)", /not a real number/],
    ["(-8)^(1/3)", /not a real number/],
    ["round(2.5, 100)", /round digits must be an integer from 0 to 15/],
    ["min()", /min takes 1 to 50 arguments, got 0/],
    ["1,000 + 5", /without thousands separators/],
    ["3 x 4", /^Error: /],
    ["１+１", /^Error: cannot parse/], // fullwidth digits
    ["2 + 𝟚", /^Error: /],
    ["1 +", /^Error: cannot parse/],
    ["(".repeat(300) + "1" + ")".repeat(300), /at most 200 accepted/],
    ["1+".repeat(150) + "1", /at most 200 accepted/],
    ["", /empty expression/],
    ["   ", /empty expression/],
  ])("%s", (expr, why) => {
    const out = ev(expr);
    expect(out).toMatch(/^Error: /);
    expect(out).toMatch(why);
    expect(out.length).toBeLessThan(160);
    expect(out).not.toContain("\n");
  });

  it("refuses non-string input without throwing", () => {
    expect(ev(42)).toBe("Error: expression must be a string, got number");
    expect(ev(undefined)).toBe("Error: expression must be a string, got undefined");
    expect(ev(null)).toBe("Error: expression must be a string, got null");
    expect(ev(["1+1"])).toBe("Error: expression must be a string, got array");
    expect(ev({ toString: () => "1+1" })).toBe("Error: expression must be a string, got object");
  });

  it("nests up to the length cap without blowing the stack", () => {
    expect(ev("(".repeat(99) + "7" + ")".repeat(99))).toBe("7");
    expect(ev("-".repeat(199) + "1")).toBe("-1");
  });
});
