// Placeholder until this page is written.
export default function Settings() {
  return <h1>Settings</h1>;
}
