/** cli-progress for the page: progress bars are drawn on a terminal by the scripts; the page shows its
 *  own progress (web/main.ts) and never creates one. */
function refuse(): never {
  throw new Error("cli-progress: the page has no terminal; it draws its own progress");
}
class SingleBar {
  constructor() {
    refuse();
  }
}
class MultiBar {
  constructor() {
    refuse();
  }
}
export default { SingleBar, MultiBar, Presets: {} };
