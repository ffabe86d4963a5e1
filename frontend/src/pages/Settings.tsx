// Settings: the project's secrets and API keys.
import ApiKeys from "./settings/ApiKeys";
import Secrets from "./settings/Secrets";
import "./settings/settings.css";

export default function Settings() {
  return (
    <>
      <h1>Settings</h1>
      <Secrets />
      <ApiKeys />
    </>
  );
}
