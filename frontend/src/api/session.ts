// Where the signed-in key lives: sessionStorage (this tab), or localStorage when the user asks
// to stay signed in. Never in a URL, never logged.
const NAME = "specdeck.key";
type Listener = () => void;
const listeners = new Set<Listener>();

export const session = {
  key(): string | null {
    return sessionStorage.getItem(NAME) ?? localStorage.getItem(NAME);
  },
  signIn(key: string, remember: boolean): void {
    this.clear();
    (remember ? localStorage : sessionStorage).setItem(NAME, key);
    listeners.forEach((l) => l());
  },
  clear(): void {
    sessionStorage.removeItem(NAME);
    localStorage.removeItem(NAME);
  },
  /** A 401: the key is gone or revoked; back to sign-in. */
  expired(): void {
    if (this.key() === null) return;
    this.clear();
    listeners.forEach((l) => l());
  },
  subscribe(listener: Listener): () => void {
    listeners.add(listener);
    return () => listeners.delete(listener);
  },
};
